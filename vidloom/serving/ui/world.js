// World-model sessions in the playground: open one from a first frame, drive it from the keyboard over the
// session WebSocket (protocol: docs/world-models-cosmos3.md), draw each chunk's frames on a canvas as they come.
// Loaded after app.js, whose helpers ($, json, state, reportError) it uses.
"use strict";

// Arrow keys / WASD -> the first two action numbers (the rest of the row stays 0); space: a policy chunk.
const WORLD_KEYS = {
  ArrowLeft: [-1, 0], ArrowRight: [1, 0], ArrowUp: [0, -1], ArrowDown: [0, 1],
  a: [-1, 0], d: [1, 0], w: [0, -1], s: [0, 1],
};
const world = { ws: null, mode: null, header: null, left: 0, chunks: 0 };

function startWorld(caps) {
  $("#world").hidden = !caps.sessions;
  if (!caps.sessions) return;
  $("#world-form").addEventListener("submit", (event) => openWorld(event).catch(worldError));
  $("#world-close").addEventListener("click", closeWorld);
  $("#world-canvas").addEventListener("keydown", worldKey);
}

function worldError(error) {
  $("#world-error").textContent = error.message || String(error);
}

async function openWorld(event) {
  event.preventDefault();
  closeWorld();
  $("#world-error").textContent = "";
  const form = $("#world-form");
  const body = new FormData();
  for (const name of ["prompt", "mode", "domain_name", "chunk_size", "num_inference_steps", "seed"]) {
    const value = form.elements[name].value.trim();
    if (value !== "") body.append(name, value);
  }
  body.append("resolution_tier", "256");
  body.append("input_reference", form.elements.input_reference.files[0]);
  const session = await json("/v1/sessions", { method: "POST", body });
  world.mode = session.mode;
  world.chunks = 0;
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  // A browser's WebSocket cannot send an Authorization header: the key travels as a subprotocol.
  const protocols = state.key ? ["vidloom", `bearer.${state.key}`] : [];
  const ws = new WebSocket(`${scheme}://${location.host}/v1/sessions/${session.id}/ws`, protocols);
  ws.binaryType = "blob";
  ws.onmessage = (message) => worldMessage(message.data).catch(worldError);
  ws.onclose = () => { if (world.ws === ws) { world.ws = null; $("#world-close").disabled = true; } };
  world.ws = ws;
  $("#world-close").disabled = false;
  $("#world-canvas").focus();
}

function closeWorld() {
  if (world.ws) world.ws.close();  // the server closes the session and frees it
  world.ws = null;
  $("#world-close").disabled = true;
  $("#world-status").textContent = "No session.";
}

async function worldMessage(data) {
  if (typeof data !== "string") {  // one frame of the current chunk
    const bitmap = await createImageBitmap(data);
    const canvas = $("#world-canvas");
    canvas.width = bitmap.width;
    canvas.height = bitmap.height;
    canvas.getContext("2d").drawImage(bitmap, 0, 0);
    world.left -= 1;
    if (world.left === 0) {
      world.chunks += 1;
      canvas.dataset.chunks = String(world.chunks);
      const acted = world.header.actions ? ` · actions ${JSON.stringify(world.header.actions[0])}…` : "";
      $("#world-status").textContent = `Chunk ${world.header.index} shown${acted}. Keys drive the next one.`;
    }
    return;
  }
  const message = JSON.parse(data);
  if (message.type === "session") {
    const keys = message.mode === "policy" ? "space" : "arrow keys or WASD";
    $("#world-status").textContent = `Session open (${message.mode}, ${message.domain_name}): press ${keys}.`;
  } else if (message.type === "chunk") {
    world.header = message;
    world.left = message.frames;
  } else if (message.type === "error") {
    $("#world-error").textContent = message.message;
  } else if (message.type === "closed") {
    $("#world-status").textContent = `Session ${message.reason}.`;
  }
}

function worldKey(event) {
  if (!world.ws || world.ws.readyState !== WebSocket.OPEN) return;
  const move = WORLD_KEYS[event.key];
  if (world.mode === "policy" ? event.key !== " " : !move) return;
  event.preventDefault();
  if (world.mode === "policy") {
    world.ws.send("{}");
  } else {
    const width = Number($("#world-form").elements.width.value) || 2;
    const row = Array.from({ length: width }, (_, i) => (i < 2 ? move[i] : 0));
    const rows = Array.from({ length: Number($("#world-form").elements.chunk_size.value) || 1 }, () => row);
    world.ws.send(JSON.stringify({ actions: rows }));
  }
  $("#world-status").textContent = "Rolling out the next chunk…";
}
