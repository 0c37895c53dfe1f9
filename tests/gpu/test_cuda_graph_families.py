"""CUDA graphs of every newly captured family on a real device: replayed steps against the eager CUDA run of the
same weights, one capture per signature, no eager fallback. Unmeasured on the branch that wrote it (it had no
GPU); the bounds follow tests/gpu/test_cuda_graphs.py's Wan check: the same kernels replayed, so at most one uint8
level on frames, and float32 rounding noise on a waveform."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.graph_families import WRITERS, graph_counts, outputs, requests
from vidloom.core.deploy import DeployConfig
from vidloom.generator import VideoGenerator


@pytest.mark.parametrize("kind", sorted(WRITERS))
def test_graphed_family_matches_eager_on_cuda(kind, tmp_path):
    if kind == "stable-audio":
        pytest.importorskip("torchsde")
    folder = WRITERS[kind](tmp_path / kind)
    eager = VideoGenerator.from_pretrained(folder, device="cuda")
    graphed = VideoGenerator.from_pretrained(folder, device="cuda", deploy=DeployConfig(cuda_graphs=True))
    for fields in requests(kind):
        (want_frames, want_audio), (frames, audio) = outputs(eager, fields), outputs(graphed, fields)
        assert frames.shape == want_frames.shape and (audio is None) == (want_audio is None)
        # Frames are uint8 levels (<= 1 apart); a waveform's samples are in [-1, 1] (<= 1e-3 apart).
        assert np.abs(frames.astype(np.int16) - want_frames.astype(np.int16)).max(initial=0) <= 1, (kind, fields)
        if audio is not None:
            assert audio.shape == want_audio.shape and np.isfinite(audio).all()
            assert np.abs(audio - want_audio).max() <= 1e-3, (kind, fields["prompt"], np.abs(audio - want_audio).max())
    stats = graphed.engine.graph_stats
    captures, replays = graph_counts(kind)[-1]
    assert stats == {"captures": captures, "replays": replays, "fallbacks": 0}, stats
