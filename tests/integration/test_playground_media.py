"""The playground's other kinds of work in a real browser: uploads (video-to-video), images and edits, the
reasoned prompt shown apart, and a soundtrack's audio player."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.helpers.browser import browser, fill, page, require_chromium, screenshot  # noqa: F401 (fixtures)
from tests.helpers.servers import ThreadServer
from tests.helpers.wan_i2v_checkpoints import make_image
from vidloom.serving.config import ServeConfig


def _engine(folder: Path):  # type: ignore[no-untyped-def]
    from vidloom.generator import VideoGenerator

    return VideoGenerator.from_pretrained(folder, device="cpu").engine


def _server(engine, tmp_path: Path) -> ThreadServer:  # type: ignore[no-untyped-def]
    return ThreadServer(engine, ServeConfig(data_dir=tmp_path / "data", graceful_shutdown_s=2, max_body_bytes=4 << 20))


def _completed(page, timeout: float = 120_000) -> str:  # type: ignore[no-untyped-def]
    """Submit the form; the job's id once it completed (its failure message fails the test)."""
    page.click("#submit")
    page.wait_for_selector("li.job[data-status=completed], li.job[data-status=failed]", timeout=timeout)
    job = page.locator("li.job").first
    assert job.get_attribute("data-status") == "completed", job.locator(".error").inner_text()
    return job.get_attribute("data-id")


def _images(page, count: int) -> None:  # type: ignore[no-untyped-def]
    """Submit the form and wait for `count` images in all (or the form's error, which fails the test)."""
    page.click("#submit")
    page.wait_for_function("""(count) => document.querySelectorAll('#image-list img').length === count ||
      document.querySelector('#form-error').textContent !== ''""", arg=count, timeout=60_000)
    assert page.locator("#form-error").inner_text() == ""


def test_a_video_upload_goes_as_multipart(browser, page, demo_engine, tmp_path):
    from vidloom.media.video import write_video

    frames = np.stack([np.asarray(make_image(48, 32, seed=i)) for i in range(5)])
    clip = write_video(frames, 8, tmp_path / "clip.mp4")
    with _server(demo_engine, tmp_path) as server:
        page.goto(server.url)
        page.wait_for_selector("#main:not([hidden])")
        # strength: an input of the card's with no control of its own on the page gets a generic field
        fill(page, "the clip, restyled", {"num_inference_steps": "2", "num_frames": "", "size": "48x32",
                                          "strength": "0.6"})
        page.set_input_files("#gen-form [name=video]", str(clip))
        page.click("#snippet-box summary")
        assert "-F 'video=@clip.mp4'" in page.locator("#snippet").inner_text()
        video_id = _completed(page)
        params = server.app.state.jobs.get(video_id).params
        assert params["num_frames"] == 5  # as many frames as the uploaded clip: the file reached the model
        assert params["strength"] == 0.6


def test_images_and_an_edit(browser, page, flux2_distilled_dir, tmp_path):
    with _server(_engine(flux2_distilled_dir), tmp_path) as server:
        page.goto(server.url)
        page.wait_for_selector("#main:not([hidden])")
        assert page.locator("#generate-title").inner_text() == "Generate an image"
        assert not page.locator("#jobs").is_visible() and not page.locator("[name=num_frames]").is_visible()
        assert page.locator("[data-input=input_reference]").inner_text().strip() == "Reference image"
        fill(page, "a lighthouse", {"size": "48x32", "num_inference_steps": "1", "seed": "3"})
        _images(page, 1)
        first = page.locator("#image-list img").first
        assert first.evaluate("img => [img.naturalWidth, img.naturalHeight]") == [48, 32]
        reference = tmp_path / "ref.png"
        make_image(64, 64, seed=5).save(reference)  # the card's min_image_side
        fill(page, "the same, at dusk", {"size": ""})
        page.set_input_files("#gen-form [name=input_reference]", str(reference))
        page.click("#snippet-box summary")
        assert "/v1/images/edits" in page.locator("#snippet").inner_text()
        _images(page, 2)
        edited = page.locator("#image-list img").first  # newest first; its size is the reference's
        assert edited.evaluate("img => [img.naturalWidth, img.naturalHeight]") == [64, 64]
        screenshot(page, "playground-images")


@pytest.fixture(scope="module")
def cosmos3_sound_engine(tmp_path_factory):  # type: ignore[no-untyped-def]
    require_chromium()  # skip before building the checkpoint
    from tests.helpers.cosmos3_sound_checkpoints import write_tiny_cosmos3_sound

    return _engine(write_tiny_cosmos3_sound(tmp_path_factory.mktemp("cosmos3-sound") / "tiny"))


def test_reasoning_apart_and_a_soundtrack(browser, page, cosmos3_sound_engine, tmp_path):
    with _server(cosmos3_sound_engine, tmp_path) as server:
        page.goto(server.url)
        page.wait_for_selector("#main:not([hidden])")
        assert page.locator("[data-input=sound]").is_visible() and page.locator("[data-input=reason]").is_visible()
        fill(page, "a red fox in the snow", {"size": "32x32", "num_frames": "5", "num_inference_steps": "2"})
        page.check("#gen-form [name=sound]")
        page.check("#gen-form [name=reason]")
        video_id = _completed(page)
        job = page.locator("li.job").first
        written = server.app.state.jobs.get(video_id).metadata["reasoned_prompt"]
        reasoning = job.locator(".reasoning")
        assert reasoning.is_visible() and reasoning.inner_text() == written  # the model's prompt, apart
        assert job.locator(".prompt").inner_text() == "a red fox in the snow"
        page.wait_for_function("""() => { const a = document.querySelector('li.job audio');
          return a !== null && a.readyState >= 1 && a.duration > 0; }""", timeout=30_000)
