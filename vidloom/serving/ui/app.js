// vidloom playground: a client of the public API (README "Web playground"). No framework, no build step.
"use strict";

const $ = (selector) => document.querySelector(selector);
const KEY_STORE = "vidloom.apiKey";
const FINAL = ["completed", "failed", "cancelled"];
const JOBS_POLL_MS = 3000;  // how often the list looks for jobs other clients created
const state = {
  key: sessionStorage.getItem(KEY_STORE), model: null, caps: null, tab: "curl", chat: [],
  followed: new Set(), deleted: new Set(),  // job ids with an open event stream; ids deleted from this page
};

class NeedKey extends Error {}

// -- the API ------------------------------------------------------------------------------

function authHeaders(extra = {}) {
  return state.key ? { ...extra, Authorization: `Bearer ${state.key}` } : extra;
}

async function api(path, options = {}) {
  const response = await fetch(path, { ...options, headers: authHeaders(options.headers) });
  if (response.status === 401) {
    askKey(state.key ? "That key was refused." : "");
    throw new NeedKey();
  }
  if (!response.ok) {
    let message = `${response.status} ${response.statusText}`;
    try { message = (await response.json()).error.message; } catch (_) { /* not our error shape */ }
    throw new Error(message);
  }
  return response;
}

const json = async (path, options) => (await api(path, options)).json();

// Server-Sent Events read from a fetch() body: EventSource cannot send the Authorization header.
async function* sseEvents(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const frame = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let event = "message", data = "";
      for (const line of frame.split("\n")) {
        if (line.startsWith("event:")) event = line.slice(6).trim();
        else if (line.startsWith("data:")) data += line.slice(5).trim();
      }
      if (data) yield { event, data };
    }
  }
}

// A URL a <video>/<img> can load: the path itself, or (with a key, which such elements cannot send) a blob.
async function mediaUrl(path) {
  if (!state.key) return path;
  return URL.createObjectURL(await (await api(path)).blob());
}

function showStatus(message) { $("#status").textContent = message; }

// -- start: the key, then the card ----------------------------------------------------------

function askKey(message) {
  $("#main").hidden = true;
  $("#key-panel").hidden = false;
  $("#key-error").textContent = message;
  $("#api-key").focus();
}

async function start() {
  let details, models;
  try {
    models = await json("/v1/models");
    // ?model=ID picks one of several served models (a fleet); the first one otherwise.
    const asked = new URLSearchParams(location.search).get("model");
    const id = models.data.some((m) => m.id === asked) ? asked : models.data[0].id;
    details = await json(`/v1/models/${encodeURIComponent(id)}`);
  } catch (error) {
    if (!(error instanceof NeedKey)) showStatus(`cannot reach the server: ${error.message}`);
    return;
  }
  state.model = details.id;
  state.caps = details.capabilities;
  $("#key-panel").hidden = true;
  $("#main").hidden = false;
  $("#forget-key").hidden = !state.key;
  $("#model-name").textContent = state.model;
  $("#model-about").textContent = state.caps.description;
  buildForm(state.caps);
  showAdapters(models.data.filter((m) => m.parent === state.model));
  startChat(state.caps);  // chat.js
  startAudio(state.caps);  // audio.js: audio clips and speech
  startCamera(state.caps);  // camera.js: a camera-controlled model's keys and intrinsics
  startWorld(state.caps);  // world.js: the keyboard view of world-model sessions
  if (state.caps.videos) {
    await loadJobs();
    setInterval(() => loadJobs().catch(reportError), JOBS_POLL_MS);
  }
}

function buildForm(caps) {
  const form = $("#gen-form");
  $("#generate").hidden = !(caps.videos || caps.images);
  $("#jobs").hidden = !caps.videos;
  $("#generate-title").textContent = caps.videos ? "Generate a video" : "Generate an image";
  const options = Object.fromEntries((caps.options || []).map((option) => [option.name, option]));
  for (const name of caps.inputs) if (!form.elements[name]) addInputField(form, name, options[name]);
  for (const label of form.querySelectorAll("[data-input]")) label.hidden = !caps.inputs.includes(label.dataset.input);
  for (const part of form.querySelectorAll("[data-video]")) part.hidden = !caps.videos;
  for (const part of form.querySelectorAll("[data-image]")) part.hidden = caps.videos;
  for (const name of caps.required_inputs) form.elements[name] && (form.elements[name].required = true);
  const d = caps.defaults;
  form.elements.size.value = d.size || "";
  form.elements.num_frames.value = d.num_frames || "";
  form.elements.num_inference_steps.value = d.num_inference_steps || "";
  form.elements.num_inference_steps.max = caps.limits.max_steps || "";
  form.elements.num_frames.max = caps.limits.max_frames || "";
  form.elements.guidance_scale.value = d.guidance_scale ?? "";
  form.elements.negative_prompt.value = d.negative_prompt || "";
  form.elements.prompt.maxLength = caps.limits.max_prompt_chars || 100000;
  updateSnippet();
}

// An input of the card's that the page has no control of its own for (an option block's field: an action, a
// strength...), built from the option's declaration (capabilities.options): a switch, a number, or a text field
// whose JSON value is sent as it is (or the text, when it is not JSON).
function addInputField(form, name, option) {
  const kind = option ? option.kind : "json";
  const label = document.createElement("label");
  label.className = kind === "bool" ? "toggle" : "wide";
  label.dataset.input = name;
  label.title = option ? option.help : "";
  const input = document.createElement("input");
  input.name = name;
  input.autocomplete = "off";
  if (kind === "bool") {
    input.type = "checkbox";
    label.append(input, ` ${name}`);
    FLAGS.push(name);
  } else {
    if (kind === "float" || kind === "int") {
      input.type = "number";
      input.step = kind === "int" ? "1" : "any";
      NUMBERS.push(name);
    } else if (kind === "str") {
      TEXTS.push(name);
    } else {
      JSON_TEXTS.push(name);
    }
    label.textContent = kind === "array" || kind === "json" ? `${name} (JSON)` : name;
    label.append(input);
  }
  form.querySelector(".actions").before(label);
}

// LoRA adapters loaded on the server (GET /v1/models lists them beside their base model): one to mix in.
function showAdapters(adapters) {
  const select = $("#gen-form").elements.lora;
  for (const adapter of adapters) select.append(new Option(adapter.id, adapter.id));
  for (const label of document.querySelectorAll("[data-lora]")) label.hidden = !adapters.length;
}

// -- generation -----------------------------------------------------------------------------

const NUMBERS = ["num_frames", "num_inference_steps", "guidance_scale", "seed"];
const TEXTS = ["prompt", "negative_prompt", "size", "camera"];
const JSON_TEXTS = ["intrinsics"];  // numbers as JSON text ([fx, fy, cx, cy]); a form part carries the text
const FILES = ["input_reference", "last_image", "video"];
const FLAGS = ["sound", "reason"];

// The form's fields that differ from "unset": {fields, files}. Hidden fields are not sent.
function formRequest() {
  const form = $("#gen-form"), fields = { model: state.model }, files = {};
  const shown = (names) => names.map((name) => form.elements[name]).filter((input) => !input.closest("label").hidden);
  for (const input of shown(TEXTS)) if (input.value.trim()) fields[input.name] = input.value.trim();
  for (const input of shown(NUMBERS)) if (input.value !== "") fields[input.name] = Number(input.value);
  for (const input of shown(FLAGS)) if (input.checked) fields[input.name] = true;
  for (const input of shown(FILES)) if (input.files.length) files[input.name] = input.files[0];
  for (const input of shown(JSON_TEXTS)) if (input.value.trim()) fields[input.name] = jsonValue(input);
  const lora = form.elements.lora.value;
  if (lora) fields.loras = [{ name: lora, scale: Number(form.elements.lora_scale.value || 1) }];
  if (!state.caps.videos) {
    delete fields.num_frames;
    fields.response_format = "b64_json";
    if (files.input_reference) return { fields, files: { image: files.input_reference } };  // an edit
  }
  return { fields, files };
}

function jsonValue(input) {
  try { return JSON.parse(input.value); } catch (_) { return input.value.trim(); }  // the server names the field
}

// Where a request goes and the openai client call that sends it.
function endpoint(files) {
  if (state.caps.videos) return { path: "/v1/videos", call: "client.videos.create" };
  if (files.image) return { path: "/v1/images/edits", call: "client.images.edit" };
  return { path: "/v1/images/generations", call: "client.images.generate" };
}

// JSON, or multipart when there are files (as the openai client sends uploads).
function requestBody(fields, files) {
  if (!Object.keys(files).length) {
    return { body: JSON.stringify(fields), headers: { "Content-Type": "application/json" } };
  }
  const body = new FormData();
  for (const [name, value] of Object.entries({ ...fields, ...files })) {
    body.append(name, typeof value === "object" && !(value instanceof Blob) ? JSON.stringify(value) : value);
  }
  return { body, headers: {} };
}

async function submit(event) {
  event.preventDefault();
  const { fields, files } = formRequest();
  $("#form-error").textContent = "";
  $("#submit").disabled = true;
  try {
    if (state.caps.videos) await submitVideo(fields, files);
    else await submitImage(fields, files);
  } catch (error) {
    if (!(error instanceof NeedKey)) $("#form-error").textContent = error.message;
  } finally {
    $("#submit").disabled = false;
  }
}

async function submitVideo(fields, files) {
  const video = await json("/v1/videos", { method: "POST", ...requestBody(fields, files) });
  renderJob(video);
  follow(video.id);
}

async function submitImage(fields, files) {
  const result = await json(endpoint(files).path, { method: "POST", ...requestBody(fields, files) });
  $("#image-results").hidden = false;
  const format = result.output_format || "png";
  for (const item of result.data) {
    const img = document.createElement("img");
    img.src = item.url || `data:image/${format};base64,${item.b64_json}`;
    img.alt = fields.prompt;
    const size = fields.size || state.caps.defaults.size || "";
    const caption = [fields.prompt, size, fields.seed !== undefined ? `seed ${fields.seed}` : ""];
    $("#image-list").prepend(figure(img, caption.filter(Boolean).join(" · "), img.src, `vidloom-image.${format}`));
  }
}

// A result with its caption and a download link (every kind of result: images, audio clips, speech, videos).
function figure(media, caption, href, filename) {
  const box = document.createElement("figure");
  const text = document.createElement("figcaption");
  text.textContent = caption;
  box.append(media, text, downloadLink(href, filename));
  return box;
}

function downloadLink(href, filename) {
  const link = document.createElement("a");
  link.className = "download";
  link.href = href;
  link.download = filename;
  link.textContent = `Download ${filename.split(".").pop()}`;
  return link;
}

// -- the jobs list ----------------------------------------------------------------------------

// The newest page of jobs, this page's and other clients' (curl, the openai package); each running one followed.
async function loadJobs() {
  const page = await json("/v1/videos?limit=20&order=desc");
  for (const video of page.data.reverse()) {
    if (state.deleted.has(video.id) || state.followed.has(video.id)) continue;
    if (!document.querySelector(`li[data-id="${video.id}"]`)) renderJob(video);
    if (!FINAL.includes(video.status)) follow(video.id);
  }
}

function jobItem(id) {
  let item = document.querySelector(`li[data-id="${id}"]`);
  if (item) return item;
  item = document.createElement("li");
  item.className = "job";
  item.dataset.id = id;
  item.innerHTML = `<div class="thumb"></div><div class="body"><p class="prompt"></p>
    <p><span class="status"></span> <progress max="100" value="0"></progress></p>
    <p class="reasoning" hidden></p><p class="error"></p><div class="media"></div>
    <p><button type="button" class="cancel">Cancel</button>
    <button type="button" class="delete">Delete</button></p></div>`;
  item.querySelector(".cancel").addEventListener("click", () => act(id, "cancel"));
  item.querySelector(".delete").addEventListener("click", () => act(id, "delete"));
  $("#job-list").prepend(item);
  return item;
}

function renderJob(video) {
  if (state.deleted.has(video.id)) return;  // a stream's last event may come after the delete
  const item = jobItem(video.id);
  item.dataset.status = video.status;
  item.querySelector(".prompt").textContent = video.prompt || "";
  item.querySelector(".status").textContent = `${video.status} ${video.progress}% - ${video.size}, ${video.seconds}s`;
  item.querySelector("progress").value = video.progress;
  item.querySelector(".error").textContent = video.error ? video.error.message : "";
  item.querySelector(".cancel").hidden = FINAL.includes(video.status);
  const reasoned = video.metadata && video.metadata.reasoned_prompt;
  if (reasoned) showReasoning(item, reasoned, false);
  if (video.status === "completed" && !item.dataset.shown) showResult(item, video).catch(reportError);
}

function showReasoning(item, text, append) {
  const box = item.querySelector(".reasoning");
  box.hidden = false;
  box.textContent = append ? box.textContent + text : text;
}

async function showResult(item, video) {
  item.dataset.shown = "1";
  const base = `/v1/videos/${video.id}/content`;
  const thumb = document.createElement("img");
  thumb.alt = "first frame";
  thumb.src = await mediaUrl(`${base}?variant=thumbnail`);
  item.querySelector(".thumb").replaceChildren(thumb);
  const file = await mediaUrl(base);  // one fetch (with a key) for the player, the soundtrack and the download
  const player = item.querySelector("video") || addPlayer(item, "video");
  if (!player.dataset.streaming) player.src = file;
  if (video.parameters && video.parameters.sound) addPlayer(item, "audio").src = file;
  item.querySelector(".media").append(downloadLink(file, `${video.id}.mp4`));
}

function addPlayer(item, kind) {
  const player = document.createElement(kind);
  player.controls = true;
  player.preload = "auto";
  if (kind === "video") player.muted = true;  // browsers autoplay only muted video
  item.querySelector(".media").append(player);
  return player;
}

// A causal model's growing fMP4, fed to Media Source Extensions as it arrives: it plays while the job runs
// (a plain <video src> waits until the browser's probe buffer fills) and the API key travels with fetch().
async function streamVideo(id) {
  const item = jobItem(id);
  if (item.querySelector("video") || !window.MediaSource) return;
  const player = addPlayer(item, "video");
  player.dataset.streaming = "1";
  player.autoplay = true;
  try {
    const source = new MediaSource();
    player.src = URL.createObjectURL(source);
    await new Promise((resolve) => source.addEventListener("sourceopen", resolve, { once: true }));
    const reader = (await api(`/v1/videos/${id}/content?variant=stream`)).body.getReader();
    let buffer = null, head = new Uint8Array(0);
    for (;;) {
      let { value, done } = await reader.read();
      if (done) break;
      if (!buffer) {  // the codecs string comes from the init segment's sample entries
        head = Uint8Array.from([...head, ...value]);
        const codecs = mp4Codecs(head);
        if (!codecs) continue;
        buffer = source.addSourceBuffer(`video/mp4; codecs="${codecs}"`);
        value = head;
      }
      buffer.appendBuffer(value);
      await new Promise((resolve) => buffer.addEventListener("updateend", resolve, { once: true }));
    }
    if (buffer) source.endOfStream();
  } catch (error) {
    player.remove();  // the finished file shows once the job completes
    reportError(error);
  }
}

// "avc1.PPCCLL[,mp4a.40.2]" from an MP4 init segment (ISO 14496-15: avcC holds profile, compatibility, level).
function mp4Codecs(bytes) {
  const find = (tag) => {
    outer: for (let i = 0; i + tag.length <= bytes.length; i++) {
      for (let j = 0; j < tag.length; j++) if (bytes[i + j] !== tag.charCodeAt(j)) continue outer;
      return i;
    }
    return -1;
  };
  const at = find("avcC");
  if (at < 0 || at + 8 > bytes.length || find("mvex") < 0) return null;  // mvex: the moov is all there
  const hex = (b) => b.toString(16).padStart(2, "0");
  const video = `avc1.${hex(bytes[at + 5])}${hex(bytes[at + 6])}${hex(bytes[at + 7])}`;
  return find("mp4a") >= 0 ? `${video},mp4a.40.2` : video;
}

async function follow(id) {
  state.followed.add(id);
  try {
    const response = await api(`/v1/videos/${id}/events`);
    for await (const { event, data } of sseEvents(response)) {
      if (state.deleted.has(id)) return;
      const payload = JSON.parse(data);
      const item = jobItem(id);
      if (event === "progress") {
        item.querySelector("progress").value = payload.percent;
        item.querySelector(".status").textContent = `${payload.status} ${payload.percent}%` +
          (payload.phase ? ` (${payload.phase} ${payload.step}/${payload.total})` : "");
        item.dataset.status = payload.status;
        item.querySelector(".cancel").hidden = false;
      } else if (event === "chunk") {
        if (state.caps.streams_chunks) streamVideo(id);
      } else if (event === "reasoning") {
        showReasoning(item, payload.text, true);
      } else {
        renderJob(payload);  // completed / failed / cancelled: the video object
      }
    }
  } catch (error) {
    reportError(error);
  }
}

async function act(id, action) {
  try {
    if (action === "cancel") renderJob(await json(`/v1/videos/${id}/cancel`, { method: "POST" }));
    else {
      await api(`/v1/videos/${id}`, { method: "DELETE" });
      state.deleted.add(id);
      jobItem(id).remove();
    }
  } catch (error) {
    reportError(error);
  }
}

function reportError(error) {
  if (!(error instanceof NeedKey)) showStatus(error.message);
}

// -- wiring ---------------------------------------------------------------------------------------

document.addEventListener("DOMContentLoaded", () => {
  $("#key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    state.key = $("#api-key").value.trim();
    sessionStorage.setItem(KEY_STORE, state.key);
    start();
  });
  $("#forget-key").addEventListener("click", () => {
    sessionStorage.removeItem(KEY_STORE);
    location.reload();
  });
  $("#gen-form").addEventListener("submit", submit);
  $("#gen-form").addEventListener("input", updateSnippet);
  for (const tab of document.querySelectorAll("[data-tab]")) {
    tab.addEventListener("click", () => { state.tab = tab.dataset.tab; updateSnippet(); });
  }
  $("#copy").addEventListener("click", () => navigator.clipboard.writeText($("#snippet").textContent)
    .then(() => showStatus("copied"), () => showStatus("copy failed: select the text instead")));
  start();
});
