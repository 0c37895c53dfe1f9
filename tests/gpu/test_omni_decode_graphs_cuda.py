"""The Omni families' paged decode step (Qwen2.5-Omni's dense decoders, Qwen3-Omni's MoE ones with their fixed-shape
expert dispatch) captured into real CUDA graphs (runtime.decode_graphs), against the eager CUDA run of the same
weights: chats stepped together over batch buckets 4, 2 and 1, a second run replaying without a capture, and a spoken
reply through the thinker's and talker's graphs. Skipped without CUDA (tests/gpu/conftest.py).

Unmeasured on the branch that wrote it (it had no GPU). Bounds: float32 on both sides, but a replay attends over a
bucketed key width and runs its GEMMs over the bucket's rows, which may choose other kernels than the eager step's:
1e-4 of the round's largest logit (CPU, stand-in capturer: 3.6e-7 at most), as loose as tests/gpu/test_chat_cuda.py's
1e-3 absolute on logits of a few units;
greedy tokens are compared over the first rounds only, where a near-tie on random weights cannot have flipped them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.helpers.decode_graph_checks import check_cuda_graphs, eager_and_graphed_on_cuda
from tests.helpers.qwen3_omni_checkpoints import TALKER_A, THINKER_A, write_tiny_thinker
from tests.helpers.qwen_omni_checkpoints import OMNI_A, write_tiny_omni
from vidloom.generator import VideoGenerator

LOGIT_RTOL = 1e-4  # of the round's largest logit: see the module docstring
WRITERS = {"qwen-omni": lambda folder: write_tiny_omni(folder, OMNI_A),
           "qwen3-omni": lambda folder: write_tiny_thinker(folder, THINKER_A, talker=TALKER_A)}


@pytest.fixture(scope="module", params=sorted(WRITERS))
def models(request, tmp_path_factory) -> tuple[VideoGenerator, VideoGenerator]:
    folder: Path = WRITERS[request.param](tmp_path_factory.mktemp(f"graphs-cuda-{request.param}") / request.param)
    return eager_and_graphed_on_cuda(folder)


def test_captured_decode_matches_eager_on_cuda(models):
    eager, graphed = models
    check_cuda_graphs(eager, graphed, LOGIT_RTOL)


def test_captured_speech_matches_eager_on_cuda(models):
    eager, graphed = models
    messages = [{"role": "user", "content": "say something about kites"}]
    audio = {"voice": "Chelsie", "max_audio_tokens": 6, "greedy": True}
    before = graphed.engine.graph_stats["replays"]
    want = eager.chat(messages, audio=audio, max_tokens=4, temperature=0, seed=3)
    got = graphed.chat(messages, audio=audio, max_tokens=4, temperature=0, seed=3)
    assert got.audio.shape == want.audio.shape and torch.isfinite(torch.as_tensor(got.audio)).all()
    stats = graphed.engine.graph_stats
    assert stats["replays"] > before and stats["fallbacks"] == 0, stats
