"""The playground's world-model view in a real browser (Debian chromium driven by Playwright): open a session
from a first frame, drive two chunks with the keyboard, see them drawn on the canvas; leaving frees the session."""

from __future__ import annotations

import io
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.helpers.browser import browser, page, require_chromium, screenshot  # noqa: F401 (fixtures)
from tests.helpers.servers import ThreadServer
from vidloom.core.deploy import DeployConfig
from vidloom.serving.config import ServeConfig

KEY = "sk-world-0123456789"
# Functions, never expressions: Playwright evaluates a bare expression with eval(), which the page's CSP refuses.
CHUNKS_SHOWN = "(n) => Number(document.querySelector('#world-canvas').dataset.chunks || 0) >= n"
CANVAS_LIT = """() => { const c = document.querySelector('#world-canvas');
  const pixels = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  return [c.width, c.height, pixels.some((v, i) => i % 4 !== 3 && v > 0)]; }"""


@pytest.fixture(scope="module")
def world_generator(cosmos3_action_dir: Path):
    require_chromium()
    from vidloom.generator import VideoGenerator

    return VideoGenerator.from_pretrained(cosmos3_action_dir, device="cpu", deploy=DeployConfig(kv_session_ttl_s=600))


def test_drive_a_world_model_from_the_keyboard(browser, page, world_generator, tmp_path):  # noqa: F811
    png = io.BytesIO()
    Image.fromarray(np.random.default_rng(5).integers(0, 256, (48, 64, 3), dtype=np.uint8)).save(png, format="PNG")
    caches = world_generator.engine.caches
    baseline = caches.bytes_in_use
    config = ServeConfig(data_dir=tmp_path / "data", graceful_shutdown_s=2, api_key=KEY)
    with ThreadServer(world_generator.engine, config) as server:
        page.goto(server.url)
        page.fill("#api-key", KEY)
        page.click("#key-form button")
        page.wait_for_selector("#world:not([hidden])")
        page.fill("#world-form [name=prompt]", "push the block to the left")
        page.set_input_files("#world-form [name=input_reference]",
                             files=[{"name": "first.png", "mimeType": "image/png", "buffer": png.getvalue()}])
        page.fill("#world-form [name=num_inference_steps]", "2")
        page.fill("#world-form [name=seed]", "11")
        page.click("#world-open")
        page.wait_for_function("() => document.querySelector('#world-status').textContent.includes('open')")
        page.press("#world-canvas", "ArrowLeft")
        page.wait_for_function(CHUNKS_SHOWN, arg=1, timeout=120_000)
        page.press("#world-canvas", "d")
        page.wait_for_function(CHUNKS_SHOWN, arg=2, timeout=120_000)
        assert page.evaluate(CANVAS_LIT) == [64, 48, True]
        assert "Chunk 1 shown" in page.locator("#world-status").inner_text()
        assert page.locator("#world-error").inner_text() == ""
        sessions = server.app.state.sessions
        (session,) = [sessions.find(i) for i in caches.session_ids()]
        assert session.rollout.index == 2 and caches.bytes_in_use > baseline
        screenshot(page, "playground-world", "#world")
        page.click("#world-close")
        deadline = time.monotonic() + 30
        while (len(sessions) or caches.bytes_in_use != baseline) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(sessions) == 0 and caches.bytes_in_use == baseline  # closing the view frees the session
