"""Chat on the one engine, over a tiny Cosmos3 checkpoint: chat runs stepped together through the paged decoder
(continuous batching), seeded sampling, stops, admission, release."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import pytest

from vidloom.core.chat import ChatResult, TokenDelta, build_chat_request
from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import CacheBudgetExceeded, Cancelled, InvalidRequest, LimitExceeded
from vidloom.core.loop import is_decode_step
from vidloom.generator import VideoGenerator
from vidloom.runtime.chat_stream import delta_of, stream_alone
from vidloom.runtime.results import chat_result
from vidloom.runtime.engine import Engine, RequestRun

PROMPTS = ["hello world", "tell me a story about robots and the physical world", "1 2 3", "what is in this picture?"]


@pytest.fixture(scope="module")
def generator(cosmos3_dir: Path) -> VideoGenerator:
    return VideoGenerator.from_pretrained(cosmos3_dir, device="cpu", deploy=DeployConfig(kv_pool_tokens=512))


def _request(text: str, **sampling):
    return build_chat_request([{"role": "user", "content": text}], **sampling)


class Together:
    """Chat runs stepped as the device worker steps them: one decoder forward for every planned sequence."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.runs: dict[str, tuple[RequestRun, list]] = {}

    def admit(self, request) -> list:
        items: list = []
        run = self.engine.submit(request, lambda e: items.append(d) if (d := delta_of(e)) else None)
        self.runs[request.request_id] = (run, items)
        return items

    def cancel(self, request_id: str) -> None:
        self.runs[request_id][0].cancel.cancel()

    def step(self) -> int:
        """One round; returns how many sequences the forward carried."""
        planned = []
        for key, (run, items) in list(self.runs.items()):
            try:
                run.prepare()
                if run.done:
                    items.append(chat_result(run.outputs()))
            except Exception as exc:  # Cancelled, or an injected failure
                items.append(exc)
            if run.done or not is_decode_step(run.pending_plan):
                run.close()
                del self.runs[key]
            else:
                planned.append((key, run, items))
        if planned:
            rows = self.engine.decoder.run([run.pending_plan for _, run, _ in planned])
            for (key, run, items), row in zip(planned, rows):
                try:
                    run.complete(row)
                except Exception as exc:
                    items.append(exc)
                    run.close()
                    del self.runs[key]
        return len(planned)

    def drain(self) -> int:
        steps = 0
        while self.runs:
            steps += self.step() > 0
        return steps


def _run_together(engine: Engine, requests) -> dict[str, list]:
    together = Together(engine)
    items = {r.request_id: together.admit(r) for r in requests}
    steps = 0
    while together.runs:
        steps += 1
        assert together.step() <= len(requests)
    assert steps >= 8
    return items


def _alone(generator: VideoGenerator, request) -> ChatResult:
    return list(stream_alone(generator.engine, request))[-1]


def test_batch_of_different_lengths_gives_each_its_tokens_alone(generator: VideoGenerator):
    budgets = [12, 8, 16, 5]
    requests = [_request(p, max_tokens=n, temperature=0) for p, n in zip(PROMPTS, budgets)]
    together = _run_together(generator.engine, requests)
    for r in requests:
        alone = _alone(generator, dataclasses.replace(r, request_id=r.request_id + "-alone"))
        result = together[r.request_id][-1]
        assert isinstance(result, ChatResult) and result.token_ids == alone.token_ids
        deltas = [i for i in together[r.request_id] if isinstance(i, TokenDelta)]
        assert "".join(d.text for d in deltas) == result.text
        assert sum(len(d.token_ids) for d in deltas) == result.completion_tokens
    assert generator.engine.decoder.stats()["kv_blocks_in_use"] == 0


def test_sequences_join_between_steps(generator: VideoGenerator):
    together = Together(generator.engine)
    first, late = _request(PROMPTS[1], max_tokens=10, temperature=0), _request(PROMPTS[0], max_tokens=6, temperature=0)
    items = {first.request_id: together.admit(first)}
    for _ in range(3):
        together.step()
    items[late.request_id] = together.admit(late)  # prefills while `first` decodes
    assert together.step() == 2
    together.drain()
    for r in (first, late):
        alone = _alone(generator, dataclasses.replace(r, request_id="x"))
        assert items[r.request_id][-1].token_ids == alone.token_ids


def test_seeded_sampling_is_reproducible(generator: VideoGenerator):
    runs = [generator.chat([{"role": "user", "content": "hello"}], max_tokens=16, temperature=1.0, top_p=0.9,
                           top_k=40, seed=seed) for seed in (7, 7, 8)]
    assert runs[0].token_ids == runs[1].token_ids
    assert runs[0].token_ids != runs[2].token_ids
    # A seeded sequence samples the same inside a batch as alone.
    requests = [_request("hello", max_tokens=16, temperature=1.0, top_p=0.9, top_k=40, seed=7),
                _request(PROMPTS[1], max_tokens=9, temperature=0.7, seed=3)]
    together = _run_together(generator.engine, requests)
    assert together[requests[0].request_id][-1].token_ids == runs[0].token_ids


def test_stop_string_ends_the_text_before_it(generator: VideoGenerator):
    full = generator.chat([{"role": "user", "content": PROMPTS[1]}], max_tokens=24, temperature=0)
    text = full.text
    cut = next(i for i in range(len(text) // 2, len(text)) if text[i:i + 2].isprintable())
    stop = text[cut:cut + 2]
    at = text.find(stop)
    stopped = list(generator.chat_stream([{"role": "user", "content": PROMPTS[1]}], max_tokens=24, temperature=0,
                                         stop=[stop, "never-there"]))
    result = stopped[-1]
    assert result.finish_reason == "stop" and result.text == text[:at]
    assert "".join(i.text for i in stopped[:-1]) == text[:at]  # the stop string never streamed out
    assert full.finish_reason in ("length", "stop") and full.completion_tokens <= 24


def test_length_and_window_limits(generator: VideoGenerator):
    result = generator.chat([{"role": "user", "content": "hi"}], max_tokens=3, temperature=0)
    assert (result.finish_reason, result.completion_tokens) in (("length", 3), ("stop", result.completion_tokens))
    limits = generator.engine.decoder.limits
    assert limits.context_window == 512  # bounded by the pool
    with pytest.raises(LimitExceeded) as exc:
        generator.chat([{"role": "user", "content": "hi"}], max_tokens=limits.max_tokens)
    assert exc.value.field == "max_tokens"


def test_admission_refuses_when_the_pool_is_full(generator: VideoGenerator):
    together = Together(generator.engine)
    held = [_request("hi", max_tokens=200, temperature=0) for _ in range(2)]
    sinks = [together.admit(r) for r in held]
    together.step()  # their loops start: each reserves prompt + 200 tokens of the 512
    full = _request("hi", max_tokens=200, temperature=0)
    with pytest.raises(CacheBudgetExceeded, match="kv_pool_tokens=512"):
        list(stream_alone(generator.engine, full))
    for r in held:
        together.cancel(r.request_id)
    together.step()
    assert generator.engine.decoder.stats()["kv_blocks_in_use"] == 0
    assert [type(items[-1]) for items in sinks] == [Cancelled, Cancelled]


def test_pool_is_full_again_after_any_mix_of_finish_cancel_and_failure(generator: VideoGenerator, monkeypatch):
    decoder = generator.engine.decoder
    rng = random.Random(0)
    doomed: set[str] = set()
    advance = decoder.loop.advance

    def failing(state, logits):
        if state.prompt.request.request_id in doomed and len(state.completion) >= 2:
            raise RuntimeError("injected failure")
        return advance(state, logits)

    monkeypatch.setattr(decoder.loop, "advance", failing)
    together = Together(generator.engine)
    outcomes: dict[str, list] = {}
    for i in range(8):
        r = _request(rng.choice(PROMPTS), max_tokens=rng.randint(2, 12), temperature=rng.choice([0, 0.8]), seed=i)
        outcomes[r.request_id] = together.admit(r)
        if i % 3 == 1:
            doomed.add(r.request_id)
    for step in range(40):
        if step == 2:
            for rid in list(outcomes)[::4]:
                if rid in together.runs:
                    together.cancel(rid)
        if not together.runs:
            break
        together.step()
    assert not together.runs
    assert decoder.stats()["kv_blocks_in_use"] == 0
    kinds = {type(items[-1]).__name__ if not isinstance(items[-1], ChatResult) else items[-1].finish_reason
             for items in outcomes.values()}
    assert "RuntimeError" in kinds and "Cancelled" in kinds and kinds & {"length", "stop"}


def test_image_inputs_and_models_without_chat_are_refused(generator: VideoGenerator, demo_cache, monkeypatch):
    from PIL import Image
    import base64
    import io

    buf = io.BytesIO()
    Image.new("RGB", (4, 4)).save(buf, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    with pytest.raises(InvalidRequest) as exc:
        generator.chat([{"role": "user", "content": [{"type": "text", "text": "what"},
                                                     {"type": "image_url", "image_url": {"url": url}}]}])
    assert exc.value.field == "messages[0].content[1]"
    with pytest.raises(InvalidRequest) as exc:
        generator.chat([{"role": "robot", "content": "x"}])
    assert exc.value.field == "messages[0].role"
    monkeypatch.setenv("VIDLOOM_CACHE", str(demo_cache))
    video_only = VideoGenerator.from_pretrained("wan2.1-demo", device="cpu")
    with pytest.raises(InvalidRequest) as exc:
        video_only.chat([{"role": "user", "content": "hi"}])
    assert exc.value.field == "model" and "does not support chat" in str(exc.value)


def test_pool_size_is_checked_at_load(cosmos3_dir: Path):
    from vidloom.core.errors import DeployError

    with pytest.raises(DeployError, match="kv_pool_tokens"):
        DeployConfig(kv_pool_tokens=8)
    with pytest.raises(DeployError, match="--kv-pool-tokens.*--kv-cache-budget-mb"):
        VideoGenerator.from_pretrained(cosmos3_dir, device="cpu",
                                       deploy=DeployConfig(kv_pool_tokens=4096, kv_cache_budget_bytes=1000))
    small = VideoGenerator.from_pretrained(cosmos3_dir, device="cpu", deploy=DeployConfig(kv_pool_tokens=40))
    assert small.engine.decoder.stats()["kv_blocks_total"] == 2  # whole blocks of 16
    assert small.engine.caches.bytes_in_use == small.engine.decoder.pool.nbytes  # the pool is one accounted allocation


def test_stopping_a_sync_stream_early_frees_its_blocks(generator: VideoGenerator):
    stream = generator.chat_stream([{"role": "user", "content": "hello"}], max_tokens=100, temperature=0)
    first = next(stream)
    assert isinstance(first, TokenDelta) and generator.engine.decoder.stats()["kv_blocks_in_use"] > 0
    stream.close()
    assert generator.engine.decoder.stats()["kv_blocks_in_use"] == 0
