"""CUDA graphs of the step body for every family that declares them, driven on CPU by the stand-in capturer.

The capturer (tests/helpers/graph_capturer.py) keeps a CUDA graph's contract: the step is recorded once over
static inputs, and each replay recomputes the outputs from whatever the static buffers then hold. So a request
whose per-request tensors (reference tokens, duration token, camera, positions, CLIP tokens, text, a chunk's history
latents) did not reach
the static buffers would replay the first request's and differ from its plain run; a causal rollout whose replays
wrote K/V anywhere but the slab its request reads would differ too. Per family: a first request captures (once
per signature: AnyFlow-FAR once per chunk position, Cosmos3 and HunyuanVideo-1.5 once per prompt-length bucket, a
Helios pyramid once per stage) and replays every step (Helios: of both chunks, the second's history latents the
first's), a second of the same signature (other prompt, seed and conditioning) replays without a capture,
and a changed signature (size, a longer prompt, or CFG off where every request has one size) captures anew; every
output equals the plain run's (Cosmos3's and HunyuanVideo-1.5's within a uint8 level: graph_families.LEVELS). The
kernels themselves are captured in tests/gpu/test_cuda_graph_families.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.graph_capturer import RecordingCapturer, graphed_generator
from tests.helpers.graph_families import LEVELS, WRITERS, graph_counts, requests, result
from vidloom.generator import VideoGenerator


@pytest.fixture(scope="module", params=sorted(WRITERS))
def family(request, tmp_path_factory) -> tuple[str, VideoGenerator]:
    kind = request.param
    if kind == "stable-audio":
        pytest.importorskip("torchsde")
    folder = WRITERS[kind](tmp_path_factory.mktemp(f"graphs-{kind}") / kind)
    return kind, VideoGenerator.from_pretrained(folder, device="cpu")


def test_replayed_steps_equal_the_plain_run(family):
    kind, plain = family
    assert "cuda_graphs" in plain.card.capabilities.supported, plain.card.capabilities.why_not.get("cuda_graphs")
    capturer = RecordingCapturer()
    graphed = graphed_generator(plain, capturer)
    first, second, changed = requests(kind)
    for fields, (captures, replays) in zip((first, second, changed), graph_counts(kind)):
        want, got = result(plain, fields), result(graphed, fields)
        # The stand-in replays the same ops over the same values; the guidance scale, a 0-dim float32 buffer in
        # the graph, multiplies exactly as the eager float does (diffusion.guidance.cfg_combine): bit-equal, but
        # for Cosmos3's and HunyuanVideo-1.5's bucket-padded prompts (graph_families.LEVELS).
        assert got.shape == want.shape and np.abs(got - want).max() <= LEVELS.get(kind, 0), (kind, fields["prompt"])
        stats = graphed.engine.graph_stats
        assert (stats["captures"], stats["replays"], stats["fallbacks"]) == (captures, replays, 0), (kind, stats)
        assert capturer.calls == captures
    # The second request's own conditioning reached its steps (else the replay would have matched the first's).
    assert not np.array_equal(result(plain, first), result(plain, second))
