"""CUDA graphs of the Omni families' paged decode step (runtime.decode_graphs), driven on CPU by the stand-in capturer:
Qwen2.5-Omni (dense thinker and talker) and Qwen3-Omni (MoE thinker and talker, whose experts take their host-free
dispatch under the captured step: SparseMoE.fixed_experts, both its per-pair and its every-expert branch).

The capturer (tests/helpers/graph_capturer.py) keeps a CUDA graph's contract: the step is recorded once over static
inputs and each replay recomputes the outputs from whatever the static buffers then hold, so a step whose tokens,
positions, block tables or sequence positions did not reach the buffers would replay stale ones and its tokens would
leave the eager run's. Chats are stepped together in rounds as the AsyncEngine's worker steps them (one decode
forward per round over every running sequence), with budgets that end at different rounds, so one run visits the
batch buckets 4, 2 and 1 with sequences of mixed lengths in each. The kernels are captured in tests/gpu.

Tolerance: a graphed step attends over a bucketed key width (padded keys masked: exact zeros in the softmax) and
runs its linears over the bucket's rows (and Qwen3-Omni's MoE sums its experts in another order), so float32 logits
may differ from the eager step's in the last bits: at most 1e-5 of the round's largest logit (measured: 7.6e-6 and
4.8e-6 absolute on logits up to 21, i.e. 3.6e-7 and 2.3e-7 relative); greedy tokens must be identical.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from tests.helpers.chat_rounds import greedy_rounds
from tests.helpers.decode_graph_checks import PROMPTS, check_stand_in_graphs
from tests.helpers.graph_capturer import RecordingCapturer, graphed_generator
from tests.helpers.qwen3_omni_checkpoints import TALKER_A, THINKER_A, write_tiny_thinker
from tests.helpers.qwen_omni_checkpoints import OMNI_A, write_tiny_omni
from vidloom.core.chat import build_chat_request
from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import DeployError
from vidloom.generator import VideoGenerator
from vidloom.runtime import decode_graphs
from vidloom.runtime.async_engine import AsyncEngine
from vidloom.runtime.decode_graphs import DECODE_BATCH_BUCKETS, DECODE_GRAPH_MAX_CONTEXT, batch_bucket, context_bucket
from vidloom.runtime.engine import Engine
from vidloom.runtime.paged_kv import DecodeKV

LOGIT_RTOL = 1e-5  # of the round's largest logit: see the module docstring
WRITERS = {"qwen-omni": lambda folder: write_tiny_omni(folder, OMNI_A),
           "qwen3-omni": lambda folder: write_tiny_thinker(folder, THINKER_A, talker=TALKER_A)}


@pytest.fixture(scope="module", params=sorted(WRITERS))
def omni(request, tmp_path_factory) -> tuple[Path, VideoGenerator]:
    folder = WRITERS[request.param](tmp_path_factory.mktemp(f"graphs-{request.param}") / request.param)
    return folder, VideoGenerator.from_pretrained(str(folder), device="cpu", dtype="float32")


def _graphed(plain: VideoGenerator, capturer: RecordingCapturer) -> Engine:
    """The same loaded model with cuda_graphs on, its steps recorded by `capturer` (the CUDA check at load is the
    real capturer's: test_cuda_graphs_need_cuda_at_load)."""
    return graphed_generator(plain, capturer).engine


def test_graphed_decode_equals_eager_and_replays_per_bucket(omni):
    _, plain = omni
    check_stand_in_graphs(plain, LOGIT_RTOL)


def test_spoken_reply_with_graphs_equals_eager(omni):
    """Speech: the thinker's decode steps (with hidden states for the talker) and the talker's (input rows)
    replay graphs; the reply and its speech codes equal the eager run's."""
    _, plain = omni
    capturer = RecordingCapturer()
    graphed = VideoGenerator(_graphed(plain, capturer))
    messages = [{"role": "user", "content": "say something about kites"}]
    audio = {"voice": "Chelsie", "max_audio_tokens": 6, "greedy": True}
    want = plain.chat(messages, audio=audio, max_tokens=4, temperature=0, seed=3)  # seed: token2wav's noise
    got = graphed.chat(messages, audio=audio, max_tokens=4, temperature=0, seed=3)
    assert got.text == want.text and got.audio_tokens == want.audio_tokens
    assert torch.allclose(torch.as_tensor(got.audio), torch.as_tensor(want.audio), rtol=0, atol=1e-5)  # in [-1, 1]
    stats = graphed.engine.graph_stats
    # Bucket 1 of the thinker (with hidden states) and of the talker (input rows): one capture each, and one more
    # for each context width (a power of two of blocks) a sequence grows into.
    assert stats["captures"] == capturer.calls >= 2 and stats["fallbacks"] == 0 and stats["replays"] > 0


def test_buckets():
    assert [batch_bucket(n) for n in (1, 2, 3, 5, 64)] == [1, 2, 4, 8, 64]
    assert batch_bucket(65) is None  # past the largest bucket: eager
    assert [context_bucket(n) for n in (1, 2, 3, 4, 5, 9)] == [1, 2, 4, 4, 8, 16]


def test_cuda_graphs_need_cuda_at_load(omni):
    folder, _ = omni
    with pytest.raises(DeployError, match="cuda_graphs needs a CUDA device"):
        VideoGenerator.from_pretrained(str(folder), device="cpu", deploy=DeployConfig(cuda_graphs=True))


def test_concurrent_chats_on_the_async_engine_replay_graphs(omni):
    """The AsyncEngine's worker decodes concurrent chats in one forward per round: through graphs, each chat's
    tokens are its eager tokens, whatever rounds the sequences joined in."""
    _, plain = omni
    capturer = RecordingCapturer()
    engine = AsyncEngine(_graphed(plain, capturer))
    requests = [build_chat_request([{"role": "user", "content": p}], max_tokens=5, temperature=0) for p in PROMPTS]

    async def stream(request) -> list:
        return [item async for item in engine.chat(request)]

    async def together() -> list:
        return await asyncio.gather(*(stream(r) for r in requests))

    try:
        streams = asyncio.run(together())
    finally:
        engine.close()
    want = [plain.chat([{"role": "user", "content": p}], max_tokens=5, temperature=0).token_ids for p in PROMPTS]
    assert [stream[-1].token_ids for stream in streams] == want
    stats = engine.engine.graph_stats
    assert stats["replays"] > 0 and stats["fallbacks"] == 0 and stats["captures"] == capturer.calls


def test_a_failed_capture_runs_that_bucket_eagerly(omni):
    """A capture that raises (an op a graph cannot hold) turns that bucket eager for good, with the same tokens."""
    _, plain = omni
    graphed = _graphed(plain, RecordingCapturer(fail=True))
    want, _ = greedy_rounds(plain.engine, PROMPTS[:2], (3, 3))
    assert greedy_rounds(graphed, PROMPTS[:2], (3, 3))[0] == want
    stats = graphed.graph_stats
    assert stats["captures"] == stats["replays"] == 0 and stats["fallbacks"] >= 1


def test_contexts_past_the_captured_width_run_eagerly_and_admission_counts_the_graphs(omni, monkeypatch):
    """A step whose longest sequence needs more than DECODE_GRAPH_MAX_CONTEXT keys runs eagerly (one block here, which
    every prompt outgrows); a chat under graphs is charged for two rows of that many keys."""
    _, plain = omni
    graphed = _graphed(plain, RecordingCapturer())
    chat = build_chat_request([{"role": "user", "content": PROMPTS[1]}], max_tokens=4, temperature=0)
    prompt = graphed.decoder.chat_slots(chat)["chat"]
    assert graphed.decoder.memory_bytes(prompt) > plain.engine.decoder.memory_bytes(prompt)
    monkeypatch.setattr(decode_graphs, "DECODE_GRAPH_MAX_CONTEXT", 16)
    want, _ = greedy_rounds(plain.engine, PROMPTS[:2], (3, 3))
    assert greedy_rounds(graphed, PROMPTS[:2], (3, 3))[0] == want
    assert graphed.graph_stats == {"captures": 0, "replays": 0, "fallbacks": 0}


def test_each_chat_is_charged_its_share_of_a_padded_bucket_at_the_widest_captured_context(omni):
    """B chats decode in one graphed step of batch_bucket(B) rows, each gathering keys over the widest captured context:
    the step's index tensors (measured on the real DecodeKV over the pool), one layer's gathered keys and values,
    float32 scores and per-row activations, and the copy of every bucket row's logits, fit in B chats' charges for every
    B up to the largest bucket (a short prompt: the padding rows are what its own row does not cover)."""
    _, plain = omni
    decoder = _graphed(plain, RecordingCapturer()).decoder
    chat = build_chat_request([{"role": "user", "content": "hi"}], max_tokens=1, temperature=0)
    charge = decoder.memory_bytes(decoder.chat_slots(chat)["chat"])
    pool, config = decoder.pool, decoder.loop.network.config
    element = pool.k.element_size()
    width = DECODE_GRAPH_MAX_CONTEXT // pool.layout.block_size
    kv_row = pool.k[0][0].numel() * element  # one gathered key (or value) of one layer
    per_token = (6 * config.hidden_size + 3 * config.intermediate_size) * element
    for chats in range(1, DECODE_BATCH_BUCKETS[-1] + 1):
        rows = batch_bucket(chats)
        kv = DecodeKV(pool, torch.full((rows, width), pool.scratch_block), torch.zeros(rows, dtype=torch.long), 1.0)
        gathered = kv.key_slots.numel()
        index = sum(t.numel() * t.element_size() for t in (kv.key_slots, kv.mask, kv.slots))
        layer = 2 * gathered * kv_row + gathered * 4 * config.num_attention_heads + rows * per_token
        logits = rows * config.vocab_size * element + chats * config.vocab_size * 4
        assert index + layer + logits <= chats * charge, chats
