"""Cosmos3's chat decode (a chat-only folder: the card that takes --cuda-graphs) captured into real CUDA graphs
(runtime.decode_graphs; Cosmos3Transformer.decode_graphs), against the eager CUDA run of the same weights: chats
stepped together over batch buckets 4, 2 and 1, a second run replaying without a capture, and a chat through the
public API. Skipped without CUDA (tests/gpu/conftest.py); the checks are the Omni decoders' (decode_graph_checks).

Unmeasured on the branch that wrote it (it had no GPU). Bounds as tests/gpu/test_omni_decode_graphs_cuda.py's: float32
on both sides, but a replay attends over a bucketed key width and runs its GEMMs over the bucket's rows, which may
choose other kernels than the eager step's: 1e-4 of the round's largest logit (CPU, stand-in capturer: 4.4e-7 at
most); greedy tokens are compared over the first rounds only, where a near-tie on random weights cannot have flipped
them.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.helpers.cosmos3_checkpoints import strip_generation
from tests.helpers.decode_graph_checks import check_cuda_graphs, eager_and_graphed_on_cuda
from vidloom.generator import VideoGenerator

LOGIT_RTOL = 1e-4  # of the round's largest logit: see the module docstring
MESSAGES = [{"role": "user", "content": "hello world, tell me a story about robots"}]


@pytest.fixture(scope="module")
def models(cosmos3_dir: Path, tmp_path_factory) -> tuple[VideoGenerator, VideoGenerator]:
    folder = tmp_path_factory.mktemp("chat-graphs-cuda") / "chat-only"
    shutil.copytree(cosmos3_dir, folder)
    return eager_and_graphed_on_cuda(strip_generation(folder))


def test_captured_chat_decode_matches_eager_on_cuda(models):
    eager, graphed = models
    check_cuda_graphs(eager, graphed, LOGIT_RTOL)


def test_a_chat_through_the_api_replays_graphs(models):
    eager, graphed = models
    before = graphed.engine.graph_stats["replays"]
    want = eager.chat(MESSAGES, max_tokens=8, temperature=0)
    got = graphed.chat(MESSAGES, max_tokens=8, temperature=0)
    assert got.token_ids[:2] == want.token_ids[:2]
    stats = graphed.engine.graph_stats
    assert stats["replays"] > before and stats["fallbacks"] == 0, stats
