// A camera-controlled model in the playground (the card's camera block: SANA-WM): held keys write the action string
// live ("w-16,jw-8": keys held for that many frames), and the intrinsics are filled from the chosen first frame.
// Loaded after app.js, whose helpers ($, state, updateSnippet) it uses.
"use strict";

const CAMERA_KEYS = "wasdijkl";  // w/s forward/back, a/d sideways, i/k pitch, j/l yaw (docs/world-models-sana.md)

function startCamera(caps) {
  if (!caps.inputs.includes("camera")) return;
  const form = $("#gen-form");
  // One latent frame per key press (frame_multiple frames); the default drives forward over the default clip.
  const step = caps.frame_multiple || 1;
  form.elements.camera.value = `w-${Math.max(step, (caps.defaults.num_frames || step + 1) - 1)}`;
  form.elements.camera.addEventListener("keydown", (event) => cameraKey(event, step));
  if (caps.inputs.includes("intrinsics")) {
    form.elements.input_reference.addEventListener("change", () => defaultIntrinsics().catch(reportError));
  }
  updateSnippet();
}

// A key of the action language extends the last segment when it is the same key, else starts a new one.
function cameraKey(event, step) {
  const key = event.key.toLowerCase();
  if (!CAMERA_KEYS.includes(key) || event.ctrlKey || event.metaKey || event.altKey) return;
  event.preventDefault();
  const input = event.target;
  const segments = input.value.split(",").map((s) => s.trim()).filter(Boolean);
  const last = segments.length ? segments[segments.length - 1].split("-") : [];
  if (last.length === 2 && last[0] === key && /^\d+$/.test(last[1])) {
    segments[segments.length - 1] = `${key}-${Number(last[1]) + step}`;
  } else {
    segments.push(`${key}-${step}`);
  }
  input.value = segments.join(",");
  updateSnippet();
}

// [fx, fy, cx, cy] of a pinhole camera over the image: the principal point at its centre and the focal length its
// longer side (about a 53 degree field of view), unless the user wrote their own.
async function defaultIntrinsics() {
  const form = $("#gen-form"), field = form.elements.intrinsics, file = form.elements.input_reference.files[0];
  if (!file || (field.value.trim() && !field.dataset.auto)) return;
  const bitmap = await createImageBitmap(file);
  const focal = Math.max(bitmap.width, bitmap.height);
  field.value = JSON.stringify([focal, focal, bitmap.width / 2, bitmap.height / 2]);
  field.dataset.auto = "1";
  field.addEventListener("input", () => delete field.dataset.auto, { once: true });
  updateSnippet();
}
