"""The playground in a real browser (Debian chromium driven by Playwright): generate, watch, play, cancel, chat.

Set VIDLOOM_UI_SCREENSHOTS=docs/img to refresh the README's screenshots from these runs.
"""

from __future__ import annotations

import json
import threading

import httpx
import pytest

from tests.helpers.browser import (  # noqa: F401 (fixtures)
    browser, fill, page, require_chromium, screenshot, wait_until_playing_while_running,
)
from tests.helpers.servers import BLOCKING_STEPS, BlockingJob, ThreadServer
from vidloom.serving.config import ServeConfig

KEY = "sk-test-0123456789"
# About 1 s on a laptop CPU: long enough that the progress bar shows values between 0 and 100.
WATCHED = {"size": "48x32", "num_frames": "5", "num_inference_steps": "40"}
# Records every value the first job's progress bar takes (each mutation's old value, then the current one), so a
# test sees it move however fast the job runs and however many updates land between two observer callbacks.
RECORD_PROGRESS = """() => { window.seen = []; new MutationObserver((records) => {
  for (const r of records) if (r.target.tagName === 'PROGRESS' && r.oldValue !== null) window.seen.push(+r.oldValue);
  const bar = document.querySelector('li.job progress'); if (bar) window.seen.push(bar.value);
}).observe(document.querySelector('#job-list'),
           {subtree: true, childList: true, attributes: true, attributeFilter: ['value'], attributeOldValue: true}); }"""
# Functions, never expressions: Playwright evaluates a bare expression with eval(), which the page's CSP refuses.
PLAYABLE = """() => { const v = document.querySelector('li.job[data-status=completed] video');
  return v !== null && v.readyState >= 2 && v.duration > 0; }"""


def _generate_and_play(page, prompt: str) -> None:  # type: ignore[no-untyped-def]
    page.wait_for_selector("#main:not([hidden])")
    page.evaluate(RECORD_PROGRESS)
    fill(page, prompt, WATCHED)
    page.click("#submit")
    page.wait_for_function(PLAYABLE, timeout=120_000)
    seen = page.evaluate("window.seen")
    assert any(0 < value < 100 for value in seen), f"the progress bar never moved between 0 and 100: {seen}"
    assert seen[-1] == 100
    job = page.locator("li.job").first
    assert job.locator(".prompt").inner_text() == prompt
    assert job.locator(".thumb img").evaluate("img => img.complete && img.naturalWidth") == 48  # thumbnail loaded


def test_generate_watch_and_play_a_video(browser, page, demo_engine, tmp_path):
    config = ServeConfig(data_dir=tmp_path / "data", max_steps=BLOCKING_STEPS, graceful_shutdown_s=2)
    with ThreadServer(demo_engine, config) as server:
        page.goto(server.url)
        page.wait_for_function("() => document.querySelector('#model-name').textContent !== ''")  # fetched after load
        assert page.locator("#model-name").inner_text() == "wan2.1-demo"
        assert page.locator("[data-input=video]").is_visible()  # the demo reads a video (v2v)
        assert not page.locator("[data-input=input_reference]").is_visible()  # and no image
        assert not page.locator("#chat").is_visible()
        _generate_and_play(page, "a red fox runs through snow")
        page.click("#snippet-box summary")
        assert "curl http://127.0.0.1" in page.locator("#snippet").inner_text()
        screenshot(page, "playground-video")
        page.click("[data-tab=python]")
        snippet = page.locator("#snippet").inner_text()
        assert "client.videos.create(" in snippet and '"num_inference_steps": 40' in snippet
        page.locator("li.job .delete").first.click()
        page.wait_for_selector("li.job", state="detached")
        assert not server.app.state.jobs.page(None, 10, "desc").records  # deleted on the server too


def test_cancel_a_running_job(browser, page, demo_engine, tmp_path):
    config = ServeConfig(data_dir=tmp_path / "data", max_steps=BLOCKING_STEPS, graceful_shutdown_s=2)
    with ThreadServer(demo_engine, config) as server:
        page.goto(server.url)
        page.wait_for_selector("#main:not([hidden])")
        fill(page, "a very long job", {**WATCHED, "num_inference_steps": str(BLOCKING_STEPS)})
        page.click("#submit")
        page.wait_for_selector("li.job[data-status=in_progress]", timeout=60_000)
        page.wait_for_function("() => document.querySelector('li.job progress').value > 0", timeout=60_000)
        screenshot(page, "playground-running")
        page.click("li.job .cancel")
        page.wait_for_selector("li.job[data-status=cancelled]", timeout=30_000)
        assert not page.locator("li.job .cancel").is_visible() and page.locator("li.job video").count() == 0
        video_id = page.locator("li.job").get_attribute("data-id")
        assert server.app.state.jobs.get(video_id).status == "cancelled"
        # A job another client starts shows up (the list is read again every few seconds); deleting it while
        # it runs removes it for good, though its event stream still ends with a final event.
        with httpx.Client(base_url=server.url, timeout=30) as client:
            other = BlockingJob(client, wait_running=False)
            row = page.locator(f"li.job[data-id={other.id}]")
            row.locator("progress").wait_for(timeout=15_000)
            page.wait_for_selector(f"li.job[data-id={other.id}][data-status=in_progress]", timeout=30_000)
            row.locator(".delete").click()
            row.wait_for(state="detached")
            page.wait_for_timeout(1500)  # the stream's final event has arrived by now
            assert row.count() == 0 and server.app.state.jobs.get(other.id) is None


def test_with_an_api_key_the_page_asks_for_it(browser, page, demo_engine, tmp_path):
    config = ServeConfig(data_dir=tmp_path / "data", api_key=KEY, max_steps=BLOCKING_STEPS, graceful_shutdown_s=2)
    with ThreadServer(demo_engine, config) as server:
        page.goto(server.url)
        page.wait_for_selector("#key-panel:not([hidden])")
        assert not page.locator("#main").is_visible()
        screenshot(page, "playground-key")
        page.fill("#api-key", "sk-wrong")
        page.click("#key-form button")
        page.wait_for_function("() => document.querySelector('#key-error').textContent.includes('refused')")
        page.fill("#api-key", KEY)
        page.click("#key-form button")
        _generate_and_play(page, "a lighthouse at night")  # media come as blobs: <video> sends no header
        assert page.locator("li.job video").get_attribute("src").startswith("blob:")
        assert page.evaluate("sessionStorage.getItem('vidloom.apiKey')") == KEY
        page.reload()  # the key survives a reload of the tab, and the job list is back
        page.wait_for_selector("li.job[data-status=completed]")
        assert page.locator("#forget-key").is_visible()
        page.click("#forget-key")
        page.wait_for_selector("#key-panel:not([hidden])")
        assert page.evaluate("sessionStorage.getItem('vidloom.apiKey')") is None


@pytest.fixture(scope="module")
def cosmos3_engine(tmp_path_factory):  # type: ignore[no-untyped-def]
    require_chromium()  # skip before building the checkpoint
    from tests.helpers.cosmos3_checkpoints import write_tiny_cosmos3
    from vidloom.generator import VideoGenerator

    folder = write_tiny_cosmos3(tmp_path_factory.mktemp("cosmos3") / "cosmos3-tiny")
    return VideoGenerator.from_pretrained(folder, device="cpu").engine


@pytest.mark.parametrize("api_key", [None, KEY])
def test_chat_streams_an_answer(browser, page, cosmos3_engine, tmp_path, api_key):
    config = ServeConfig(data_dir=tmp_path / "data", api_key=api_key, graceful_shutdown_s=2)
    with ThreadServer(cosmos3_engine, config) as server:
        page.goto(server.url)
        if api_key:
            page.fill("#api-key", api_key)
            page.click("#key-form button")
        page.wait_for_selector("#chat:not([hidden])")
        page.evaluate("""() => { window.growth = []; new MutationObserver(() => window.growth.push(
          document.querySelector('.bubble.assistant .content')?.textContent.length || 0)).observe(
          document.querySelector('#chat-log'), {subtree: true, childList: true, characterData: true}); }""")
        # Greedy decoding: the tiny random model then answers 15 tokens every time; sampled, it may stop after one
        page.route("**/v1/chat/completions", lambda route: route.continue_(
            post_data=json.dumps({**json.loads(route.request.post_data), "temperature": 0})))
        page.fill("#chat-input", "tell me a story about robots")
        page.click("#chat-send")
        page.wait_for_selector(".bubble.user")
        page.wait_for_function("() => !document.querySelector('#chat-send').disabled", timeout=120_000)
        answer = page.locator(".bubble.assistant .content").inner_text()
        assert answer and page.locator(".bubble.assistant .error").inner_text() == ""
        assert len({n for n in page.evaluate("window.growth") if n}) > 1, "the answer arrived in one piece"
        if api_key is None:
            screenshot(page, "playground-chat", "#chat")  # random weights: the words are noise


class HeldDecode:
    """Holds a causal rollout before it decodes chunk `index`: earlier chunks are out, the job still runs."""

    def __init__(self, decode, index: int) -> None:  # type: ignore[no-untyped-def]
        self.decode, self.index, self.calls = decode, index, 0
        self.released = threading.Event()

    def __call__(self, **inputs):  # type: ignore[no-untyped-def]
        if self.calls == self.index:
            assert self.released.wait(120), "never released"
        self.calls += 1
        return self.decode(**inputs)


def test_a_causal_video_plays_while_it_streams(browser, page, tmp_path, monkeypatch):
    require_chromium()
    from tests.helpers.far_checkpoints import FAR_A, write_tiny_far
    from vidloom.generator import VideoGenerator
    from vidloom.families.wan_causal import loop as far_loop

    engine = VideoGenerator.from_pretrained(write_tiny_far(tmp_path / "far", FAR_A), device="cpu").engine
    held = HeldDecode(far_loop.decode_chunk, index=2)  # 17 frames: chunks [0, 1), [1, 9), then held at [9, 17)
    monkeypatch.setattr(far_loop, "decode_chunk", held)
    config = ServeConfig(data_dir=tmp_path / "data", graceful_shutdown_s=2)
    with ThreadServer(engine, config) as server:
        try:
            page.goto(server.url)
            page.wait_for_selector("#main:not([hidden])")
            fill(page, "a cat", {"size": "32x32", "num_frames": "17", "num_inference_steps": "2"})
            page.click("#submit")
            # The growing fMP4 plays while the job is still running (its last chunk is held back).
            wait_until_playing_while_running(page)
            streamed = page.evaluate("() => document.querySelector('li.job video').buffered.end(0)")
            assert streamed > 0
            held.released.set()
            page.wait_for_selector("li.job[data-status=completed]", timeout=60_000)
            # The rest arrives in the same player: the stream ends, so the duration is known and longer.
            page.wait_for_function("""() => { const v = document.querySelector('li.job video');
              return Number.isFinite(v.duration) && v.buffered.end(0) > %r; }""" % streamed)
            assert page.locator("li.job video").count() == 1  # the streamed player stays; no second one
        finally:
            held.released.set()  # before the server stops: its stream waits for the job
