"""AsyncEngine.chat: the device worker decodes concurrent chats together; closing a stream frees its blocks."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from vidloom.core.chat import ChatResult, TokenDelta, build_chat_request
from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import CacheBudgetExceeded, InvalidRequest
from vidloom.generator import VideoGenerator
from vidloom.runtime.async_engine import AsyncEngine
from vidloom.runtime.chat_stream import stream_alone


@pytest.fixture(scope="module")
def engine(cosmos3_dir: Path):
    generator = VideoGenerator.from_pretrained(cosmos3_dir, device="cpu", deploy=DeployConfig(kv_pool_tokens=256))
    async_engine = AsyncEngine(generator.engine)
    yield async_engine
    async_engine.close()


def _request(text: str, **sampling):
    return build_chat_request([{"role": "user", "content": text}], temperature=0, **sampling)


async def _collect(engine: AsyncEngine, request) -> list:
    return [item async for item in engine.chat(request)]


def _wait_free(engine: AsyncEngine) -> None:
    deadline = time.monotonic() + 10
    while engine.chat_stats()["kv_blocks_in_use"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.chat_stats()["kv_blocks_in_use"] == 0


def test_concurrent_chats_stream_deltas_then_result(engine: AsyncEngine):
    requests = [_request("hello world", max_tokens=12), _request("tell me a story", max_tokens=7)]
    before = engine.chat_stats()["tokens_generated_total"]

    async def main():
        return await asyncio.gather(*(_collect(engine, r) for r in requests))

    streams = asyncio.run(main())
    total = 0
    for request, items in zip(requests, streams):
        result = items[-1]
        assert isinstance(result, ChatResult) and result.request_id == request.request_id
        assert all(isinstance(i, TokenDelta) for i in items[:-1])
        assert "".join(i.text for i in items[:-1]) == result.text
        alone = list(stream_alone(engine.engine, _request(request.messages[0].text,
                                                        max_tokens=request.sampling.max_tokens)))[-1]
        assert result.token_ids == alone.token_ids
        total += result.completion_tokens
    stats = engine.chat_stats()
    assert stats["tokens_generated_total"] - before == total + sum(len(s[-1].token_ids) for s in streams)
    assert stats["kv_blocks_total"] == 16
    _wait_free(engine)


def test_closing_the_stream_cancels_and_frees_blocks(engine: AsyncEngine):
    async def main():
        stream = engine.chat(_request("hello world", max_tokens=200))
        first = await stream.__anext__()
        assert engine.chat_stats()["kv_blocks_in_use"] > 0
        await stream.aclose()
        return first

    assert isinstance(asyncio.run(main()), TokenDelta)
    _wait_free(engine)


def test_admission_errors_raise_before_the_first_item(engine: AsyncEngine):
    async def first(request):
        return await engine.chat(request).__anext__()

    async def while_one_runs():
        running = engine.chat(_request("hello world", max_tokens=200))
        await running.__anext__()  # it holds its blocks now
        try:
            with pytest.raises(CacheBudgetExceeded, match="kv_pool_tokens=256"):
                await first(_request("hello", max_tokens=100))
        finally:
            await running.aclose()

    asyncio.run(while_one_runs())
    with pytest.raises(InvalidRequest) as exc:
        asyncio.run(first(_request("hello", max_tokens=0)))
    assert exc.value.field == "max_tokens"
    _wait_free(engine)


def test_model_without_chat(demo_cache: Path, monkeypatch):
    monkeypatch.setenv("VIDLOOM_CACHE", str(demo_cache))
    video = AsyncEngine(VideoGenerator.from_pretrained("wan2.1-demo", device="cpu").engine)
    try:
        with pytest.raises(InvalidRequest) as exc:
            video.chat(_request("hi"))
        assert exc.value.field == "model"
        assert video.chat_stats() == {"tokens_generated_total": 0, "kv_blocks_in_use": 0, "kv_blocks_total": 0}
    finally:
        video.close()
