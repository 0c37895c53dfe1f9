// Chat in the playground: streamed answers, reasoning apart; a file part (audio, image, video) where the model reads
// one (capabilities.chat_inputs), and answers spoken in a voice of the model's, played inline, where it speaks.
// Loaded after app.js, whose helpers ($, api, sseEvents, state, figure) it uses.
"use strict";

const CHAT_ANSWER_FORMAT = "mp3";  // concatenated pieces of an mp3 stream are one playable file
const CHAT_PARTS = {
  audio: ["audio/wav", "audio/mpeg", ".wav", ".mp3"], image: ["image/*"],
  video: ["video/mp4", "video/webm", ".mp4", ".webm"],
};

function startChat(caps) {
  $("#chat").hidden = !caps.chat;
  if (!caps.chat) return;
  const accepts = caps.chat_inputs.flatMap((kind) => CHAT_PARTS[kind] || []);
  $("#chat-attach-label").hidden = !accepts.length;
  $("#chat-attach").accept = accepts.join(",");
  // A video's sound track is read through the audio tower: offered where the model reads both.
  $("#chat-video-sound-label").hidden = !(caps.chat_inputs.includes("video") && caps.chat_inputs.includes("audio"));
  $("#chat-aloud-label").hidden = $("#chat-voice-label").hidden = !caps.speech;
  for (const voice of caps.voices) $("#chat-voice").append(new Option(voice, voice));
  $("#chat-form").addEventListener("submit", sendChat);
}

// The user's turn as OpenAI content: the text alone, or parts (text + the attached file).
async function userContent(text) {
  const file = $("#chat-attach").files[0];
  if (!file) return text;
  const data = await base64Of(file);
  return [{ type: "text", text }, filePart(file, data)];
}

// An attached file as its part: an image_url, a video_url (the server reads the container, whatever the URL's type
// says) or an input_audio.
function filePart(file, data) {
  const name = file.name.toLowerCase();
  if (file.type.startsWith("image/")) {
    return { type: "image_url", image_url: { url: `data:${file.type};base64,${data}` } };
  }
  if (file.type.startsWith("video/") || name.endsWith(".mp4") || name.endsWith(".webm")) {
    const url = `data:${file.type || "video/mp4"};base64,${data}`;
    const sound = !$("#chat-video-sound-label").hidden && $("#chat-video-sound").checked;
    return { type: "video_url", video_url: { url, use_audio_in_video: sound } };
  }
  return { type: "input_audio", input_audio: { data, format: name.endsWith(".mp3") ? "mp3" : "wav" } };
}

function base64Of(blob) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result.slice(reader.result.indexOf(",") + 1));
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(blob);
  });
}

function chatBody(aloud) {
  const body = { model: state.model, messages: state.chat, stream: true };
  if (aloud) {
    body.modalities = ["text", "audio"];
    body.audio = { voice: $("#chat-voice").value || undefined, format: CHAT_ANSWER_FORMAT };
  }
  return body;
}

async function sendChat(event) {
  event.preventDefault();
  const text = $("#chat-input").value.trim();
  if (!text) return;
  const content = await userContent(text);
  const attached = $("#chat-attach").files[0];
  $("#chat-input").value = "";
  $("#chat-attach").value = "";
  state.chat.push({ role: "user", content });
  chatBubble("user").querySelector(".content").textContent = attached ? `${text}\n[${attached.name}]` : text;
  const aloud = !$("#chat-aloud-label").hidden && $("#chat-aloud").checked;
  const bubble = chatBubble("assistant"), answer = bubble.querySelector(".content");
  const reasoning = bubble.querySelector(".reasoning");
  const abort = new AbortController(), sound = [];
  $("#chat-stop").disabled = false;
  $("#chat-stop").onclick = () => abort.abort();
  $("#chat-send").disabled = true;
  try {
    const response = await api("/v1/chat/completions", {
      method: "POST", signal: abort.signal, headers: { "Content-Type": "application/json" },
      body: JSON.stringify(chatBody(aloud)),
    });
    for await (const { data } of sseEvents(response)) {
      if (data === "[DONE]") break;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(chunk.error.message);
      const delta = (chunk.choices[0] || {}).delta || {};
      const thought = delta.reasoning_content || delta.reasoning;  // reasoning models: shown apart
      if (thought) { reasoning.hidden = false; reasoning.textContent += thought; }
      if (delta.content) answer.textContent += delta.content;
      if (delta.audio && delta.audio.transcript) answer.textContent += delta.audio.transcript;
      if (delta.audio && delta.audio.data) sound.push(Uint8Array.from(atob(delta.audio.data), (c) => c.charCodeAt(0)));
    }
    if (sound.length) playAnswer(bubble, new Blob(sound, { type: "audio/mpeg" }));
  } catch (error) {
    if (error.name !== "AbortError") bubble.querySelector(".error").textContent = error.message;
  } finally {
    state.chat.push({ role: "assistant", content: answer.textContent });
    $("#chat-stop").disabled = true;
    $("#chat-send").disabled = false;
  }
}

// The spoken answer inline: a player (started at once) and its file.
function playAnswer(bubble, blob) {
  const player = document.createElement("audio");
  player.controls = true;
  player.src = URL.createObjectURL(blob);
  const voice = $("#chat-voice").value;
  bubble.append(figure(player, `spoken by ${voice}`, player.src, `answer.${CHAT_ANSWER_FORMAT}`));
  player.play().catch(() => {});  // a browser may refuse autoplay; the controls are there
}

function chatBubble(role) {
  const bubble = document.createElement("div");
  bubble.className = `bubble ${role}`;
  bubble.innerHTML = `<p class="reasoning" hidden></p><p class="content"></p><p class="error"></p>`;
  $("#chat-log").append(bubble);
  return bubble;
}
