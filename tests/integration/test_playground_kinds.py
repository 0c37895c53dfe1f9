"""The playground for every kind of model, each in a real browser (Debian chromium driven by Playwright), its form
built from the served card: audio clips, speech and spoken chat, a camera-controlled world model, long reasoning,
an image model's edits (qwen-image-demo).

Set VIDLOOM_UI_SCREENSHOTS=docs/img to refresh docs/playground.md's screenshots from these runs.
"""

from __future__ import annotations

import io
import json
import wave
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.helpers.browser import (  # noqa: F401 (fixtures)
    browser, fill, page, require_chromium, screenshot, wait_until_playing_while_running,
)
from tests.helpers.servers import ThreadServer
from tests.helpers.wan_i2v_checkpoints import make_image
from vidloom.serving.config import ServeConfig

# Functions, never expressions: Playwright evaluates a bare expression with eval(), which the page's CSP refuses.
AUDIO_LOADED = """(where) => { const a = document.querySelector(where);
  return a !== null && a.readyState >= 1 && a.duration > 0; }"""
PAGE_WIDTH = "() => [document.documentElement.scrollWidth, window.innerWidth]"


def _engine(name: str):  # type: ignore[no-untyped-def]
    require_chromium()  # skip before building the checkpoint
    from vidloom.generator import VideoGenerator

    return VideoGenerator.from_pretrained(name, device="cpu").engine


def _open(page, engine, tmp_path: Path) -> ThreadServer:  # type: ignore[no-untyped-def]
    server = ThreadServer(engine, ServeConfig(data_dir=tmp_path / "data", graceful_shutdown_s=2))
    page.goto(server.url)
    page.wait_for_selector("#main:not([hidden])")
    return server


def _no_error(page, where: str) -> None:  # type: ignore[no-untyped-def]
    assert page.locator(where).inner_text() == ""


def _wav(seconds: float, rate: int = 16000) -> bytes:
    samples = (np.sin(np.linspace(0, 440 * 2 * np.pi * seconds, int(rate * seconds))) * 8000).astype(np.int16)
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(rate), w.writeframes(samples.tobytes())
    return out.getvalue()


def test_an_audio_model_makes_clips_to_play_and_download(browser, page, tmp_path):
    with _open(page, _engine("stable-audio-demo"), tmp_path):
        assert page.locator("#audio-gen").is_visible()
        assert not page.locator("#generate").is_visible() and not page.locator("#chat").is_visible()
        form = page.locator("#audio-form")
        assert form.locator("[name=seconds]").input_value() == "1.024"  # the card's default clip
        assert form.locator("[name=seconds_start]").is_visible()
        form.locator("[name=prompt]").fill("rain on a tin roof")
        form.locator("[name=seconds]").fill("0.5")
        form.locator("[name=num_inference_steps]").fill("2")
        form.locator("[name=seed]").fill("4")
        form.locator("[name=output_format]").select_option("flac")
        page.click("#audio-submit")
        page.wait_for_function(AUDIO_LOADED, arg="#audio-list audio", timeout=120_000)
        _no_error(page, "#audio-error")
        clip = page.locator("#audio-list figure").first
        assert clip.locator("figcaption").inner_text() == "rain on a tin roof · 0.5 s at 16000 Hz · seed 4"
        assert clip.locator("a.download").get_attribute("download") == "vidloom-4.flac"
        assert abs(clip.locator("audio").evaluate("a => a.duration") - 0.5) < 0.05
        screenshot(page, "playground-audio", "main")


@pytest.fixture(scope="module")
def omni_engine():  # type: ignore[no-untyped-def]
    return _engine("qwen-omni-demo")


def test_speech_in_a_voice_of_the_model_plays_while_it_streams(browser, page, omni_engine, tmp_path):
    with _open(page, omni_engine, tmp_path):
        assert page.locator("#speech").is_visible() and page.locator("#chat").is_visible()
        voices = page.locator("#speech-form [name=voice] option").all_inner_texts()
        assert voices == ["Chelsie", "Ethan"]  # from the checkpoint's speaker table
        formats = page.locator("#speech-form [name=response_format] option").all_inner_texts()
        assert formats[0] == "mp3" and "wav" in formats and "pcm" not in formats
        sent = []
        page.on("request", lambda r: sent.append(r.post_data) if r.url.endswith("/v1/audio/speech") else None)
        page.fill("#speech-form [name=input]", "hello there")
        page.select_option("#speech-form [name=voice]", "Ethan")
        page.fill("#speech-form [name=seed]", "3")
        page.click("#speech-submit")
        page.wait_for_function("""() => { const a = document.querySelector('#audio-list audio');
          return a !== null && a.dataset.done === '1'; }""", timeout=120_000)
        _no_error(page, "#speech-error")
        assert json.loads(sent[0])["stream_format"] == "audio" and json.loads(sent[0])["voice"] == "Ethan"
        speech = page.locator("#audio-list figure").first
        assert int(speech.locator("audio").get_attribute("data-pieces")) >= 1  # fed to the player as it came
        assert speech.locator("audio").get_attribute("src").startswith("blob:")
        assert speech.locator("figcaption").inner_text() == '"hello there" in Ethan · mp3'
        assert speech.locator("a.download").get_attribute("href").startswith("blob:")
        page.wait_for_function(AUDIO_LOADED, arg="#audio-list audio", timeout=30_000)
        screenshot(page, "playground-speech", "main")


def test_chat_hears_a_file_and_answers_aloud(browser, page, omni_engine, tmp_path):
    with _open(page, omni_engine, tmp_path):
        assert page.locator("#chat-attach-label").is_visible()  # the demo has an audio tower
        assert "audio/wav" in page.locator("#chat-attach").get_attribute("accept")
        sent = []
        page.on("request", lambda r: sent.append(r.post_data) if r.url.endswith("/chat/completions") else None)
        page.fill("#chat-input", "what do you hear?")
        page.set_input_files("#chat-attach", files=[{"name": "tone.wav", "mimeType": "audio/wav",
                                                     "buffer": _wav(1.0)}])
        page.check("#chat-aloud")
        page.select_option("#chat-voice", "Chelsie")
        page.click("#chat-send")
        page.wait_for_function("() => !document.querySelector('#chat-send').disabled", timeout=120_000)
        _no_error(page, ".bubble.assistant .error")
        body = json.loads(sent[0])
        (part_text, part_audio) = body["messages"][0]["content"]
        assert part_text == {"type": "text", "text": "what do you hear?"} and part_audio["type"] == "input_audio"
        assert body["modalities"] == ["text", "audio"] and body["audio"]["voice"] == "Chelsie"
        page.wait_for_function(AUDIO_LOADED, arg=".bubble.assistant audio", timeout=30_000)  # the answer, inline
        answer = page.locator(".bubble.assistant figure")
        assert answer.locator("figcaption").inner_text() == "spoken by Chelsie"
        assert answer.locator("a.download").get_attribute("download") == "answer.mp3"
        screenshot(page, "playground-chat-audio", "#chat")


def test_chat_attaches_a_video_with_its_sound_and_answers_aloud(browser, page, tmp_path):
    """qwen3-omni-demo reads videos (its vision tower) with their sound (its audio tower): the file goes as a
    video_url data URL, use_audio_in_video as the toggle says, and the answer comes back spoken."""
    from tests.helpers.chat_videos import video_bytes

    with _open(page, _engine("qwen3-omni-demo"), tmp_path):
        accept = page.locator("#chat-attach").get_attribute("accept")
        assert "video/mp4" in accept and "image/*" in accept and "audio/wav" in accept
        assert page.locator("#chat-video-sound-label").is_visible()
        sent = []
        page.on("request", lambda r: sent.append(r.post_data) if r.url.endswith("/chat/completions") else None)
        page.fill("#chat-input", "what happens in the video?")
        page.set_input_files("#chat-attach", files=[{"name": "clip.mp4", "mimeType": "video/mp4",
                                                     "buffer": video_bytes(1, frames=9, sound=True)}])
        page.check("#chat-video-sound")
        page.check("#chat-aloud")
        page.click("#chat-send")
        page.wait_for_function("() => !document.querySelector('#chat-send').disabled", timeout=120_000)
        _no_error(page, ".bubble.assistant .error")
        (part_text, part_video) = json.loads(sent[0])["messages"][0]["content"]
        assert part_text == {"type": "text", "text": "what happens in the video?"}
        assert part_video["type"] == "video_url" and part_video["video_url"]["use_audio_in_video"] is True
        assert part_video["video_url"]["url"].startswith("data:video/mp4;base64,")
        page.wait_for_function(AUDIO_LOADED, arg=".bubble.assistant audio", timeout=30_000)  # the answer, inline
        assert page.locator(".bubble.user .content").inner_text() == "what happens in the video?\n[clip.mp4]"


def test_a_camera_model_is_driven_by_keys_and_its_intrinsics_come_from_the_image(browser, page, tmp_path):
    with _open(page, _engine("sana-wm-demo"), tmp_path) as server:
        camera = page.locator("#gen-form [name=camera]")
        assert camera.is_visible() and camera.input_value() == "w-16"  # the default clip, driven forward
        camera.fill("")
        camera.press("w")
        camera.press("w")
        camera.press("j")
        assert camera.input_value() == "w-16,j-8"  # a press is one latent frame (frame_multiple frames)
        first = tmp_path / "first.png"
        make_image(160, 120, seed=2).save(first)
        page.set_input_files("#gen-form [name=input_reference]", str(first))
        intrinsics = page.locator("#gen-form [name=intrinsics]")
        page.wait_for_function("() => document.querySelector('#gen-form [name=intrinsics]').value !== ''")
        assert json.loads(intrinsics.input_value()) == [160, 160, 80, 60]
        fill(page, "a road through a forest", {"num_inference_steps": "2", "seed": "5"})
        page.click("#submit")
        page.wait_for_selector("li.job[data-status=completed], li.job[data-status=failed]", timeout=180_000)
        job = page.locator("li.job").first
        assert job.get_attribute("data-status") == "completed", job.locator(".error").inner_text()
        params = server.app.state.jobs.get(job.get_attribute("data-id")).params
        assert params["camera"] == "w-16,j-8" and params["intrinsics"] == [160, 160, 80, 60]
        link = job.locator("a.download")
        link.wait_for()
        assert link.get_attribute("download").endswith(".mp4")
        screenshot(page, "playground-camera", "main")


def test_long_reasoning_wraps_inside_the_page(browser, page, tmp_path):
    with _open(page, _engine("cosmos3-demo"), tmp_path) as server:
        fill(page, "a red fox in the snow", {"size": "32x32", "num_frames": "5", "num_inference_steps": "2"})
        page.check("#gen-form [name=reason]")
        page.click("#submit")
        page.wait_for_selector("li.job[data-status=completed], li.job[data-status=failed]", timeout=180_000)
        job = page.locator("li.job").first
        assert job.get_attribute("data-status") == "completed", job.locator(".error").inner_text()
        written = server.app.state.jobs.get(job.get_attribute("data-id")).metadata["reasoned_prompt"]
        assert len(written) > 200  # long enough to stretch the page if it did not wrap
        page.wait_for_function("(n) => document.querySelector('li.job .reasoning').textContent.length === n",
                               arg=len(written))
        width, viewport = page.evaluate(PAGE_WIDTH)
        assert width <= viewport, f"the page is {width}px wide in a {viewport}px window"
        page.fill("#chat-input", "x" * 400)  # one unbroken word in a chat bubble wraps too
        page.click("#chat-send")
        page.wait_for_selector(".bubble.user")
        width, viewport = page.evaluate(PAGE_WIDTH)
        assert width <= viewport, f"the page is {width}px wide in a {viewport}px window"
        page.wait_for_function("() => !document.querySelector('#chat-send').disabled", timeout=120_000)


def test_a_loaded_lora_adapter_is_a_choice_of_the_form(browser, page, flux2_distilled_dir, tmp_path):
    from tests.helpers.lora_files import LoRASpec, write_lora
    from vidloom.generator import VideoGenerator

    require_chromium()
    engine = VideoGenerator.from_pretrained(flux2_distilled_dir, device="cpu", max_loras=1).engine
    spec = LoRASpec(rank=4, alpha=8, targets=("to_q", "to_k", "to_v", "to_qkv_mlp_proj"), seed=21)
    lora = write_lora(flux2_distilled_dir, "Flux2KleinPipeline", spec, tmp_path / "loras")
    server = ThreadServer(engine, ServeConfig(data_dir=tmp_path / "data", graceful_shutdown_s=2,
                                                lora_dirs=(tmp_path / "loras",)))
    with server, httpx.Client(base_url=server.url, timeout=60) as client:
        page.goto(server.url)
        page.wait_for_selector("#main:not([hidden])")
        assert not page.locator("#gen-form [name=lora]").is_visible()  # nothing loaded: no choice
        assert client.post("/v1/loras", json={"name": "boat", "path": str(lora)}).status_code == 200
        page.reload()
        page.wait_for_selector("#main:not([hidden])")
        assert page.locator("#gen-form [name=lora] option").all_inner_texts() == ["none", "boat"]
        sent = []
        page.on("request", lambda r: sent.append(r.post_data) if "/v1/images/" in r.url else None)
        fill(page, "a paper boat", {"size": "32x48", "num_inference_steps": "2", "seed": "4", "lora_scale": "0.8"})
        page.select_option("#gen-form [name=lora]", "boat")
        page.click("#snippet-box summary")
        assert '"loras":[{"name":"boat","scale":0.8}]' in page.locator("#snippet").inner_text()
        page.click("#submit")
        page.wait_for_function("""() => document.querySelectorAll('#image-list img').length === 1 ||
          document.querySelector('#form-error').textContent !== ''""", timeout=60_000)
        _no_error(page, "#form-error")
        assert json.loads(sent[0])["loras"] == [{"name": "boat", "scale": 0.8}]
        result = page.locator("#image-list figure").first
        assert result.locator("figcaption").inner_text() == "a paper boat · 32x48 · seed 4"
        assert result.locator("a.download").get_attribute("download") == "vidloom-image.png"


def test_the_qwen_image_demo_makes_an_image_then_edits_an_upload(browser, page, tmp_path):
    with _open(page, _engine("qwen-image-demo"), tmp_path):
        assert page.locator("#generate-title").inner_text() == "Generate an image"
        assert page.locator("[data-input=input_reference]").inner_text().strip() == "Reference image"
        sent = []
        page.on("request", lambda r: sent.append(r.url) if "/v1/images/" in r.url else None)
        done = """(count) => document.querySelectorAll('#image-list img').length === count ||
          document.querySelector('#form-error').textContent !== ''"""
        fill(page, "a lighthouse", {"size": "32x48", "num_inference_steps": "2", "seed": "3"})
        page.click("#submit")
        page.wait_for_function(done, arg=1, timeout=60_000)
        _no_error(page, "#form-error")
        reference = tmp_path / "ref.png"
        make_image(48, 40, seed=5).save(reference)
        fill(page, "the same, at dusk", {})
        page.set_input_files("#gen-form [name=input_reference]", str(reference))
        page.click("#submit")
        page.wait_for_function(done, arg=2, timeout=180_000)
        _no_error(page, "#form-error")
        assert [url.rsplit("/", 1)[-1] for url in sent] == ["generations", "edits"]
        edited = page.locator("#image-list img").first  # newest first, at the requested size
        assert edited.evaluate("img => [img.naturalWidth, img.naturalHeight]") == [32, 48]


def test_hunyuan15_takes_a_first_frame_for_image_to_video(browser, page, tmp_path):
    image = tmp_path / "first.png"
    make_image(80, 48, 1).save(image)
    with _open(page, _engine("hunyuan15-demo"), tmp_path) as server:
        assert page.locator("[data-input=input_reference]").is_visible()  # the card reads an image
        assert page.locator("[data-input=video]").is_hidden()  # and no clip
        fill(page, "a cat walks on the grass", {"num_inference_steps": "2", "num_frames": "5", "size": "80x48"})
        page.set_input_files("#gen-form [name=input_reference]", str(image))
        page.click("#submit")
        page.wait_for_selector("li.job[data-status=completed], li.job[data-status=failed]", timeout=120_000)
        job = page.locator("li.job").first
        assert job.get_attribute("data-status") == "completed", job.locator(".error").inner_text()
        video = httpx.get(f"{server.url}/v1/videos/{job.get_attribute('data-id')}").json()
        assert video["metadata"]["task"] == "i2v"  # the upload reached the model as its first frame


class _HeldChunk:
    """Holds Helios' chunk loop before it decodes chunk `index`: earlier chunks are out, the job still runs."""

    def __init__(self, decode, index: int) -> None:  # type: ignore[no-untyped-def]
        import threading

        self.decode, self.index, self.calls, self.released = decode, index, 0, threading.Event()

    def __call__(self, *args):  # type: ignore[no-untyped-def]
        if self.calls == self.index:
            assert self.released.wait(120), "never released"
        self.calls += 1
        return self.decode(*args)


def test_helios_chunks_play_while_the_video_streams(browser, page, tmp_path, monkeypatch):
    from vidloom.families.helios import loop as helios_loop

    engine = _engine("helios-demo")
    held = _HeldChunk(helios_loop.decode_chunk, index=1)  # the first 33-frame chunk goes out, the second waits
    monkeypatch.setattr(helios_loop, "decode_chunk", held)
    with _open(page, engine, tmp_path):
        try:
            assert page.locator("[data-input=video]").is_visible()  # image and clip inputs: I2V and V2V
            fill(page, "a paper boat", {"size": "96x64", "num_frames": "65", "num_inference_steps": "2"})
            page.click("#submit")
            wait_until_playing_while_running(page, timeout=120_000)
            held.released.set()
            page.wait_for_selector("li.job[data-status=completed]", timeout=120_000)
            assert page.locator("li.job video").count() == 1  # the streamed player stays
        finally:
            held.released.set()
