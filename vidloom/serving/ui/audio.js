// Audio in the playground: clips from an audio model (POST /v1/audio/generations) and speech in one of the model's
// voices (POST /v1/audio/speech, played while it streams). Both forms are filled from the card's capabilities.
// Loaded after app.js, whose helpers ($, api, json, state, requestBody, figure) it uses.
"use strict";

const AUDIO_TYPES = { mp3: "audio/mpeg", opus: "audio/ogg", aac: "audio/aac", flac: "audio/flac", wav: "audio/wav",
                      ogg: "audio/ogg" };
const STREAMED_SPEECH = "audio/mpeg";  // Media Source Extensions play mp3 pieces as they arrive

function startAudio(caps) {
  $("#audio-gen").hidden = !caps.audio;
  $("#speech").hidden = !caps.speech;
  if (caps.audio) fillAudioForm(caps);
  if (caps.speech) fillSpeechForm(caps);
}

function fillAudioForm(caps) {
  const form = $("#audio-form"), d = caps.defaults;
  form.elements.seconds.value = d.seconds ?? "";
  form.elements.seconds.max = d.max_seconds ?? "";
  form.elements.seconds.min = d.min_seconds ?? 0;
  form.elements.seconds_start.value = d.seconds_start ?? "";
  form.querySelector("[data-start]").hidden = !d.takes_start;
  form.querySelector("[data-init-audio]").hidden = !caps.inputs.includes("init_audio");
  form.elements.num_inference_steps.value = d.num_inference_steps ?? "";
  form.elements.num_inference_steps.max = caps.limits.max_steps || "";
  form.elements.guidance_scale.value = d.guidance_scale ?? "";
  form.elements.negative_prompt.value = d.negative_prompt || "";
  for (const format of d.output_formats || ["wav"]) form.elements.output_format.append(new Option(format, format));
  form.addEventListener("submit", (event) => submitAudio(event).catch((error) => formError("#audio-error", error)));
}

function fillSpeechForm(caps) {
  const form = $("#speech-form");
  for (const voice of caps.voices) form.elements.voice.append(new Option(voice, voice));
  const playable = caps.speech_formats.filter((format) => AUDIO_TYPES[format]);  // raw pcm: no player
  for (const format of playable) form.elements.response_format.append(new Option(format, format));
  form.addEventListener("submit", (event) => submitSpeech(event).catch((error) => formError("#speech-error", error)));
}

function formError(where, error) {
  if (!(error instanceof NeedKey)) $(where).textContent = error.message;
}

// The form's filled fields (numbers as numbers), hidden ones left out.
function filled(form, numbers) {
  const fields = { model: state.model };
  for (const input of form.elements) {
    if (!input.name || input.type === "file" || input.closest("label")?.hidden || input.value.trim() === "") continue;
    fields[input.name] = numbers.includes(input.name) ? Number(input.value) : input.value.trim();
  }
  return fields;
}

async function submitAudio(event) {
  event.preventDefault();
  const form = $("#audio-form");
  const fields = filled(form, ["seconds", "seconds_start", "num_inference_steps", "guidance_scale", "seed"]);
  const files = {};
  const init = form.elements.init_audio;
  if (!init.closest("label").hidden && init.files.length) files.init_audio = init.files[0];
  $("#audio-error").textContent = "";
  $("#audio-submit").disabled = true;
  try {
    const result = await json("/v1/audio/generations", { method: "POST", ...requestBody(fields, files) });
    const bytes = Uint8Array.from(atob(result.data[0].b64_json), (c) => c.charCodeAt(0));
    const url = URL.createObjectURL(new Blob([bytes], { type: AUDIO_TYPES[result.output_format] }));
    const caption = `${fields.prompt} · ${result.seconds} s at ${result.sample_rate} Hz · seed ${result.seed}`;
    showAudio(url, caption, `vidloom-${result.seed}.${result.output_format}`);
  } finally {
    $("#audio-submit").disabled = false;
  }
}

function showAudio(url, caption, filename, player = audioPlayer()) {
  if (url) player.src = url;
  $("#audio-results").hidden = false;
  const box = figure(player, caption, url, filename);
  $("#audio-list").prepend(box);
  return box;
}

function audioPlayer() {
  const player = document.createElement("audio");
  player.controls = true;
  player.preload = "auto";
  return player;
}

async function submitSpeech(event) {
  event.preventDefault();
  const fields = filled($("#speech-form"), ["seed"]);
  $("#speech-error").textContent = "";
  $("#speech-submit").disabled = true;
  try {
    const streams = fields.response_format === "mp3" && window.MediaSource && MediaSource.isTypeSupported(STREAMED_SPEECH);
    const response = await api("/v1/audio/speech", {
      method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify(streams ? { ...fields, stream_format: "audio" } : fields),
    });
    const caption = `"${fields.input}" in ${fields.voice} · ${fields.response_format}`;
    const filename = `speech.${fields.response_format}`;
    if (!streams) {
      showAudio(URL.createObjectURL(await response.blob()), caption, filename);
      return;
    }
    const player = audioPlayer();
    const box = showAudio("", caption, filename, player);
    const pieces = await playWhileStreaming(player, response);
    const url = URL.createObjectURL(new Blob(pieces, { type: STREAMED_SPEECH }));
    box.querySelector("a.download").href = url;
    player.dataset.done = "1";
  } finally {
    $("#speech-submit").disabled = false;
  }
}

// The response's pieces into a MediaSource as they arrive (the player starts on the first); all of them returned.
async function playWhileStreaming(player, response) {
  const source = new MediaSource(), pieces = [];
  player.src = URL.createObjectURL(source);
  await new Promise((resolve) => source.addEventListener("sourceopen", resolve, { once: true }));
  const buffer = source.addSourceBuffer(STREAMED_SPEECH);
  const reader = response.body.getReader();
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    pieces.push(value);
    buffer.appendBuffer(value);
    await new Promise((resolve) => buffer.addEventListener("updateend", resolve, { once: true }));
    player.dataset.pieces = String(pieces.length);
    if (pieces.length === 1) player.play().catch(() => {});  // a browser may refuse autoplay; controls are there
  }
  source.endOfStream();
  return pieces;
}
