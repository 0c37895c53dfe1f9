"""Speech requests whose talkers find the paged KV pool busy wait for it (retried each round) instead of failing:
with a pool that holds one talker at a time, concurrent requests all finish as they do alone, and one cancelled
while it waits leaves every block free."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from tests.helpers.qwen_omni_checkpoints import OMNI_A, write_tiny_omni
from tests.helpers.speech_runs import speak_together
from vidloom.core.chat import SamplingParams
from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import Cancelled, KVPoolBusy
from vidloom.core.speech import SpeechRequest
from vidloom.generator import VideoGenerator
from vidloom.runtime.async_engine import AsyncEngine
from vidloom.runtime.paged_kv import blocks_for

# The demo's speech prompt is 193 thinker tokens: a talker of 16 codes needs 193 + 2 + 16 = 211 tokens (14 blocks),
# so a 256-token pool (16 blocks) holds one talker (and one thinker) at a time.
POOL_TOKENS = 256
TEXTS = ["the kite rose over the dunes", "a red kite", "kites fly high above the sea at noon"]


@pytest.fixture(scope="module")
def small_pool(tmp_path_factory):
    torch.set_num_threads(1)
    folder = write_tiny_omni(tmp_path_factory.mktemp("omni"), OMNI_A)
    return VideoGenerator.from_pretrained(str(folder), deploy=DeployConfig(kv_pool_tokens=POOL_TOKENS))


def request(text: str, codes: int = 16, chunk: int | None = None) -> SpeechRequest:
    return SpeechRequest(text=text, voice="Chelsie", talker_sampling=SamplingParams(temperature=0.0), seed=3,
                         max_audio_tokens=codes, audio_chunk_codes=chunk)


def alone(gen: VideoGenerator, speech: SpeechRequest) -> dict:
    return gen.engine.submit(speech).finish()


def pools_empty(gen: VideoGenerator) -> bool:
    return gen.engine.decoder.stats()["kv_blocks_in_use"] == 0


@pytest.mark.parametrize(("policy", "chunk"), [("interleave", None), ("batch", 4)])
def test_talkers_that_find_the_pool_busy_wait_and_match_running_alone(small_pool, policy, chunk):
    """Streamed audio too: the talker holding the blocks needs policy turns for its chunk decodes, which a
    waiting request leaves to it (fifo never gets here: it runs them one after another)."""
    gen = small_pool
    talker = gen.engine.instance["talker"]
    pool = gen.engine.decoder.pool_of(talker)
    assert 2 * blocks_for(211) > pool.layout.num_blocks  # two talkers never fit together
    solo = [alone(gen, request(text, chunk=chunk)) for text in TEXTS]
    outs, batches = speak_together(gen, [request(text, chunk=chunk) for text in TEXTS], policy)
    assert batches and max(batches) == 1  # the talkers ran one after another: the others waited
    for out, ref in zip(outs, solo):
        assert out["codes"].tolist() == ref["codes"].tolist() and out["codes"].numel() > 3
        np.testing.assert_allclose(out["audio"], ref["audio"], atol=1e-4, rtol=0)
    assert pools_empty(gen) and pool.allocator.blocks_free == pool.layout.num_blocks


def test_a_request_cancelled_while_waiting_for_the_talker_pool_frees_everything(small_pool):
    gen = small_pool
    before = gen.engine.caches.bytes_in_use
    long_one = request(TEXTS[0], codes=48)  # 193 + 2 + 48 tokens: the whole pool, for 48 talker steps
    ref = alone(gen, long_one)
    engine = AsyncEngine(gen.engine, slots=2, policy="interleave")
    try:
        holder = engine.submit(long_one, result=lambda o: o)
        waiter = engine.submit(request(TEXTS[1]), result=lambda o: o)
        waiter_run = waiter.run
        deadline = time.monotonic() + 120
        while not waiter_run.waiting_for_kv:  # its thinker ran; its talker waits for the holder's blocks
            assert time.monotonic() < deadline and not holder._entry.future.done(), "the waiter never waited"
            time.sleep(0.002)
        assert engine.in_flight == 2  # still in flight while it waits
        assert engine.cancel(waiter.request_id)
        with pytest.raises(Cancelled):
            waiter.wait(60)
        out = holder.wait(120)
    finally:
        engine.close()
    assert out["codes"].tolist() == ref["codes"].tolist()
    assert pools_empty(gen) and gen.engine.caches.bytes_in_use == before
    assert gen.engine.admission.resident == 0  # its memory estimate was released too


def test_a_request_waiting_on_blocks_held_elsewhere_polls_without_spinning_and_starts_once_they_free(small_pool):
    """Blocks held outside the worker's runs (here: reserved by hand, as a run on another thread would): the
    waiting request retries once per KV_WAIT_POLL_S, not in a tight loop, and runs as it does alone after."""
    from vidloom.runtime.worker_rounds import KV_WAIT_POLL_S

    gen = small_pool
    speech = request(TEXTS[1])
    ref = alone(gen, speech)
    talker_pool = gen.engine.decoder.pool_of(gen.engine.instance["talker"])
    talker_pool.allocator.reserve("other#1", POOL_TOKENS)
    engine = AsyncEngine(gen.engine, slots=1)
    try:
        handle = engine.submit(speech, result=lambda o: o)
        run = handle.run
        tries = 0
        prepare = run.prepare

        def counted() -> bool:
            nonlocal tries
            tries += run.waiting_for_kv
            return prepare()

        run.prepare = counted  # type: ignore[method-assign]  (the worker reads it each round)
        deadline = time.monotonic() + 120
        while not run.waiting_for_kv:
            assert time.monotonic() < deadline
            time.sleep(0.002)
        tries, started = 0, time.monotonic()
        time.sleep(0.3)
        waited = time.monotonic() - started
        assert 0 < tries <= waited / KV_WAIT_POLL_S + 5  # a try per poll, not a spin
        assert engine.in_flight == 1 and not handle._entry.future.done()
        talker_pool.allocator.release("other#1")
        out = handle.wait(120)
    finally:
        talker_pool.allocator.release("other#1")
        engine.close()
    assert out["codes"].tolist() == ref["codes"].tolist()
    np.testing.assert_allclose(out["audio"], ref["audio"], atol=1e-4, rtol=0)
    assert pools_empty(gen)


def test_a_run_stepped_alone_still_fails_on_a_busy_pool(small_pool):
    """Nothing steps another run meanwhile, so nothing would free the blocks: the sync path raises at once."""
    gen = small_pool
    talker_pool = gen.engine.decoder.pool_of(gen.engine.instance["talker"])
    talker_pool.allocator.reserve("other#1", POOL_TOKENS)  # another request's talker holds the whole pool
    try:
        with pytest.raises(KVPoolBusy):
            alone(gen, request(TEXTS[1]))
    finally:
        talker_pool.allocator.release("other#1")
    assert pools_empty(gen)
