"""CUDA graphs of Cosmos3's chat decode (runtime.decode_graphs; Cosmos3Transformer.decode_graphs) on a chat-only folder,
driven on CPU by the stand-in capturer as the Omni families' are (tests/integration/test_omni_decode_graphs.py, whose
checks tests/helpers/decode_graph_checks.py shares): chats stepped together in rounds over batch buckets 4, 2 and 1
with mixed lengths give the eager run's greedy tokens, the same buckets replay without a capture, a new bucket (8)
captures anew. Two tiny configs: A (no attention bias, mrope axes 2/1/1) and B (bias, axes 4/2/2, three layers), so
the interleaved mrope's frequency pattern is exercised beyond one layout. The kernels are captured in tests/gpu.

Tolerance: as the Omni decoders', a graphed step attends over a bucketed key width (padded keys masked: exact zeros
in the softmax) and runs its linears over the bucket's rows, so float32 logits may differ from the eager step's in the
last bits: at most 1e-5 of the round's largest logit; greedy tokens must be identical.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.chat_rounds import greedy_rounds
from tests.helpers.cosmos3_checkpoints import COSMOS3_A, COSMOS3_B, strip_generation, write_tiny_cosmos3
from tests.helpers.decode_graph_checks import PROMPTS, check_stand_in_graphs
from tests.helpers.graph_capturer import UNCAPTURABLE, RecordingCapturer, graphed_generator
from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import DeployError
from vidloom.families.cosmos3.transformer import Cosmos3Transformer
from vidloom.generator import VideoGenerator

LOGIT_RTOL = 1e-5  # of the round's largest logit: see the module docstring
SPECS = {spec.name: spec for spec in (COSMOS3_A, COSMOS3_B)}


@pytest.fixture(scope="module", params=sorted(SPECS))
def chat_only(request, tmp_path_factory) -> tuple[Path, VideoGenerator]:
    spec = SPECS[request.param]
    folder = strip_generation(write_tiny_cosmos3(tmp_path_factory.mktemp(f"graphs-{spec.name}") / spec.name, spec))
    return folder, VideoGenerator.from_pretrained(str(folder), device="cpu", dtype="float32")


def test_graphed_chat_decode_equals_eager_and_replays_per_bucket(chat_only):
    _, plain = chat_only
    assert isinstance(plain.engine.decoder.loop.network, Cosmos3Transformer)
    assert plain.engine.decoder.pool.scratch_block is None  # no graphs: no scratch block
    worst = check_stand_in_graphs(plain, LOGIT_RTOL)
    print(f"worst logit gap / largest logit: {worst:.2e}")


def test_the_captured_step_reads_nothing_on_the_host(chat_only):
    """Every op the captured decode body dispatches (rotary over [3, B] positions, DecodeKV attention, the layers) is
    one a CUDA graph holds: no .item(), nonzero or host-to-device copy."""
    _, plain = chat_only
    ops: set[str] = set()
    graphed = graphed_generator(plain, RecordingCapturer(ops=ops)).engine
    assert graphed.decoder.pool.scratch_block is not None  # the padding rows' block, under graphs only
    want, _ = greedy_rounds(plain.engine, PROMPTS[:3], (3, 3, 3))
    assert greedy_rounds(graphed, PROMPTS[:3], (3, 3, 3))[0] == want
    assert ops and not ops & UNCAPTURABLE, sorted(ops & UNCAPTURABLE)
    assert graphed.graph_stats["replays"] > 0 and graphed.graph_stats["fallbacks"] == 0


def test_both_cards_take_cuda_graphs_and_the_full_cards_chats_replay_them(chat_only, cosmos3_dir):
    folder, _ = chat_only
    # Accepted by both cards: what stops them here is the CUDA check (tests/gpu loads them on a device).
    for path in (folder, cosmos3_dir):
        with pytest.raises(DeployError, match="cuda_graphs needs a CUDA device"):
            VideoGenerator.from_pretrained(str(path), device="cpu", deploy=DeployConfig(cuda_graphs=True))
    # With a generation pathway (its denoise steps graphed over prompt buckets) the chats' decode replays graphs too.
    plain = VideoGenerator.from_pretrained(str(cosmos3_dir), device="cpu", dtype="float32")
    graphed = graphed_generator(plain, RecordingCapturer()).engine
    want, _ = greedy_rounds(plain.engine, PROMPTS[:2], (3, 3))
    assert greedy_rounds(graphed, PROMPTS[:2], (3, 3))[0] == want
    assert graphed.graph_stats["replays"] > 0 and graphed.graph_stats["fallbacks"] == 0
