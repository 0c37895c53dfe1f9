"""Every request kind through one AsyncEngine on a tiny Cosmos3 checkpoint that both chats and generates:
chats count in the scheduler's metrics and are cancelled like jobs; a reasoner's decode steps join the chat batch."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from vidloom.core.chat import ChatResult, TokenDelta, build_chat_request
from vidloom.core.deploy import DeployConfig
from vidloom.core.output import ProgressEvent
from vidloom.core.request import GenerationRequest
from vidloom.generator import VideoGenerator
from vidloom.runtime.async_engine import AsyncEngine

VIDEO = dict(num_frames=5, height=32, width=32, guidance_scale=3.0, fps=24, seed=4)


@pytest.fixture(scope="module")
def generator(cosmos3_dir: Path) -> VideoGenerator:
    return VideoGenerator.from_pretrained(cosmos3_dir, device="cpu", deploy=DeployConfig(kv_pool_tokens=2048))


def _chat(text: str, max_tokens: int):
    return build_chat_request([{"role": "user", "content": text}], max_tokens=max_tokens, temperature=0)


def _wait(condition, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


async def _rest(stream) -> list:
    return [item async for item in stream]


def test_a_chat_started_while_a_video_renders_counts_in_the_metrics_and_is_cancelled_by_id(generator):
    engine = AsyncEngine(generator.engine, slots=1, queue_size=4, decode_slots=1)
    try:
        denoising = threading.Event()
        video = engine.submit(GenerationRequest(prompt="a fox", num_inference_steps=400, **VIDEO),
                              lambda e: denoising.set() if isinstance(e, ProgressEvent) and e.phase == "denoise" else 0)
        assert denoising.wait(60)
        assert (engine.in_flight, engine.chats_in_flight, engine.queue_depth) == (1, 0, 0)

        async def main():
            first, second = _chat("hello world", 400), _chat("tell me a story", 400)
            running = engine.chat(first)
            assert isinstance(await running.__anext__(), TokenDelta)  # decoding between the video's steps
            assert not video._entry.future.done()
            waiting = engine.chat(second)  # the one decode slot is taken: it queues like any job
            assert (engine.in_flight, engine.chats_in_flight, engine.queue_depth) == (2, 1, 1)
            assert engine.cancel(second.request_id)  # queued: cancelled now, through the jobs' path
            [result] = [item async for item in waiting]
            assert result.finish_reason == "cancelled" and result.completion_tokens == 0
            assert engine.cancel(first.request_id)  # running: stops at its next step, its blocks go back
            rest = [item async for item in running]
            assert isinstance(rest[-1], ChatResult) and rest[-1].finish_reason == "cancelled"
            assert rest[-1].completion_tokens < 400

        asyncio.run(main())
        _wait(lambda: engine.in_flight == 1, "the cancelled chat to leave its slot")
        assert engine.chat_stats()["kv_blocks_in_use"] == 0
        assert engine.cancel(video.request_id)  # the video takes the same path
        _wait(lambda: engine.in_flight == 0, "the video to stop")
    finally:
        engine.close()


def test_a_reasoning_request_and_three_chats_decode_in_one_forward(generator, monkeypatch):
    decoder = generator.engine.decoder
    forwards: list[list[str]] = []
    run = decoder.run

    def recording(plans):
        forwards.append(sorted(p.loop for p in plans))
        return run(plans)

    monkeypatch.setattr(decoder, "run", recording)
    request = GenerationRequest(prompt="a fox in the snow", reason=True, num_inference_steps=2, **VIDEO)
    engine = AsyncEngine(generator.engine)
    try:
        async def main():
            chats = [engine.chat(_chat(text, 48)) for text in ("hello world", "1 2 3", "tell me a story")]
            firsts = [await chat.__anext__() for chat in chats]  # all three decode now
            video = engine.submit(request)
            rests = await asyncio.gather(*(_rest(chat) for chat in chats))
            return firsts, rests, await video.result()

        firsts, rests, output = asyncio.run(main())
    finally:
        engine.close()
    assert ["ar_decode", "ar_decode", "ar_decode", "reason"] in forwards
    assert engine.decode_stats["largest_batch"] == 4
    for first, rest in zip(firsts, rests):
        assert isinstance(first, TokenDelta) and rest[-1].finish_reason in ("length", "stop")
    # Batched with the chats, the reasoner wrote what it writes alone.
    monkeypatch.undo()
    alone = generator.engine.run(request)["reasoned_prompt"]
    assert output.metadata["reasoned_prompt"] == alone and alone
    assert decoder.stats()["kv_blocks_in_use"] == 0


def _slow_decoding(decoder, monkeypatch, seconds: float = 0.01) -> None:
    """Each decode forward takes at least `seconds`: the tiny model decodes a 400-token chat faster than a test
    reads the engine's state, and these tests need the chats to hold their places meanwhile."""
    run = decoder.run

    def slowed(plans):
        time.sleep(seconds)
        return run(plans)

    monkeypatch.setattr(decoder, "run", slowed)


def test_a_video_sees_the_memory_running_chats_hold_on_the_one_admission_ledger(generator, monkeypatch):
    """One ledger: a budget that holds the chat or the video but not both keeps the video queued while the chat
    decodes (the sync path is refused naming the budget), and admits it once the chat leaves."""
    from vidloom.core.errors import CacheBudgetExceeded
    from vidloom.media.request_inputs import resolve_request
    from vidloom.runtime.admission import MemoryAdmission

    core = generator.engine
    _slow_decoding(core.decoder, monkeypatch)
    chat = _chat("hello world", 400)
    request = GenerationRequest(prompt="a fox", num_inference_steps=2, **VIDEO)
    chat_bytes = core.decoder.memory_bytes(core.decoder.chat_slots(chat)["chat"])
    video_bytes = core.estimator(resolve_request(request, core.instance.card))
    assert chat_bytes > 0 and video_bytes > 0
    ledger = MemoryAdmission(chat_bytes + video_bytes - 1)
    monkeypatch.setattr(core, "admission", ledger)
    engine = AsyncEngine(core, slots=1, queue_size=4)
    try:
        async def main():
            running = engine.chat(chat)
            assert isinstance(await running.__anext__(), TokenDelta)
            assert ledger.held_by("chat") == chat_bytes
            video = engine.submit(request)
            await asyncio.sleep(0.2)  # rounds pass: the video stays queued, its slot free but its memory not
            assert (engine.in_flight, engine.chats_in_flight, engine.queue_depth) == (1, 1, 1)
            alone = core.submit(request)  # stepped without a queue: refused, naming the limit and the holder
            with pytest.raises(CacheBudgetExceeded, match="request memory budget.*1 running chat"):
                alone.step()
            alone.close()
            assert engine.cancel(chat.request_id)
            await _rest(running)
            output = await video.result()  # the chat's bytes went back: the video ran
            assert output.num_frames == VIDEO["num_frames"] and ledger.in_use == 0

        asyncio.run(main())
    finally:
        engine.close()


def test_with_two_decode_slots_a_third_chat_waits_in_the_queue(generator, monkeypatch):
    _slow_decoding(generator.engine.decoder, monkeypatch)
    engine = AsyncEngine(generator.engine, slots=1, queue_size=4, decode_slots=2)
    try:
        async def main():
            chats = [_chat(text, 400) for text in ("hello world", "tell me a story", "1 2 3")]
            first, second = engine.chat(chats[0]), engine.chat(chats[1])
            for stream in (first, second):
                assert isinstance(await stream.__anext__(), TokenDelta)  # both decode in the batched step
            third = engine.chat(chats[2])
            assert (engine.in_flight, engine.chats_in_flight, engine.queue_depth) == (2, 2, 1)
            assert engine.cancel(chats[0].request_id)
            await _rest(first)
            assert isinstance(await third.__anext__(), TokenDelta)  # it took the freed decode slot
            assert engine.queue_depth == 0 and engine.chats_in_flight == 2
            for chat in chats[1:]:
                engine.cancel(chat.request_id)
            await asyncio.gather(_rest(second), _rest(third))

        asyncio.run(main())
    finally:
        engine.close()
