"""The Wan VAE's causal stream: chunk by chunk through CausalCache.stream equals one causal conv over the whole
video (the conv input written after the past frames, the taps on missing history dropped for one-frame chunks),
and the Wan2.2 duplicating shortcut added through a broadcast view equals adding the materialised duplicate."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vidloom.models.wan.vae_causal import CausalCache, CausalConv3d
from vidloom.models.wan.vae_residual import add_duplicate_up, duplicate_up

# float32 reordering of the same sums (oneDNN may block a shorter kernel differently): a few ulps of outputs ~1.
TOL = 1e-5


def _whole_video(conv: CausalConv3d, video: torch.Tensor) -> torch.Tensor:
    return conv.forward(video)  # every frame at once: zeros for all the time padding


@pytest.mark.parametrize("chunks", [(1, 1, 1, 1), (1, 4, 4), (1, 2, 1, 3), (3, 2)], ids=str)
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("with_norm", [False, True])
def test_streamed_chunks_equal_the_whole_video(chunks, channels_last, with_norm):
    torch.manual_seed(0)
    conv = CausalConv3d(4, 3, 3, padding=1)
    video = torch.randn(2, 4, sum(chunks), 5, 6)
    if channels_last:
        video = video.contiguous(memory_format=torch.channels_last_3d)
    gain = torch.rand(1, 4, 1, 1, 1) + 0.5

    def into(x: torch.Tensor, out: torch.Tensor) -> None:
        torch.mul(x, gain, out=out)
        F.silu(out, inplace=True)

    with torch.no_grad():
        expected = _whole_video(conv, F.silu(video * gain) if with_norm else video)
        cache, outputs, start = CausalCache(), [], 0
        for frames in chunks:
            cache.begin_chunk()
            outputs.append(cache.stream(conv, video[:, :, start:start + frames], into if with_norm else None))
            start += frames
    got = torch.cat(outputs, dim=2)
    assert got.shape == expected.shape
    assert (got - expected).abs().max().item() <= TOL


def test_a_first_one_frame_chunk_drops_the_taps_on_zeros():
    """No history and no norm: the conv reads the chunk itself with the kernel cut to its last tap, and the
    cache keeps a copy of the frame (not a view pinning the caller's tensor)."""
    conv = CausalConv3d(4, 3, 3, padding=1)
    frame = torch.randn(1, 4, 1, 5, 5)
    cache = CausalCache()
    cache.begin_chunk()
    with torch.no_grad():
        got = cache.stream(conv, frame)
        expected = conv.forward(frame)
    assert (got - expected).abs().max().item() <= TOL
    assert cache.get(0).shape[2] == 1 and cache.get(0).data_ptr() != frame.data_ptr()  # a copy, not a view


@pytest.mark.parametrize("in_dim, out_dim, factor_t, frames, first_chunk", [
    (8, 8, 2, 3, False), (8, 8, 2, 1, True), (8, 4, 1, 3, False), (8, 4, 1, 1, True), (8, 2, 1, 2, False),
    (8, 4, 2, 2, False), (8, 4, 2, 1, True),
    (4, 8, 2, 2, False), (16, 4, 2, 2, True),  # repeats 16, and a trimmed chunk of 2 frames: the copying path
], ids=str)
def test_adding_the_duplicate_through_a_view_equals_adding_it_materialised(in_dim, out_dim, factor_t, frames,
                                                                             first_chunk):
    torch.manual_seed(0)
    x = torch.randn(2, in_dim, frames, 3, 5).contiguous(memory_format=torch.channels_last_3d)
    duplicate = duplicate_up(x, out_dim, factor_t, 2, first_chunk)
    out = torch.randn(duplicate.shape).contiguous(memory_format=torch.channels_last_3d)
    expected = out + duplicate
    assert torch.equal(add_duplicate_up(out, x, factor_t, 2, first_chunk), expected)  # the same float adds
