"""The Wan VAE's stream shortcuts: a causal conv of a lone frame with nothing before it drops the time taps that
would multiply its zero padding (the first chunk of every decode and encode, a Qwen-Image decode's only chunk), and
a call's last chunk copies no tails for a chunk that never comes."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vidloom.models.wan.vae_causal import CausalCache, CausalConv3d

# float32 reordering of the same sums (the 3D conv adds the zero padding's exact zeros too).
TOL = 1e-5


def _padded_conv(conv: CausalConv3d, x: torch.Tensor) -> torch.Tensor:
    return F.conv3d(F.pad(x, (0, 0, 0, 0, conv.time_pad, 0)), conv.weight, conv.bias, padding=(0, 1, 1))


def test_lone_frame_conv_is_the_padded_3d_conv():
    torch.manual_seed(0)
    conv = CausalConv3d(8, 6, 3, padding=1)
    x = torch.randn(2, 8, 1, 12, 10).contiguous(memory_format=torch.channels_last_3d)
    with torch.inference_mode():
        expected = _padded_conv(conv, x)
        cache = CausalCache()
        cache.begin_chunk()
        got = cache.stream(conv, x)
        assert got.shape == expected.shape == (2, 6, 1, 12, 10)
        assert (got - expected).abs().max().item() <= TOL
        # The next frame reads the first one (and one zero frame): the stream equals the whole clip's conv.
        nxt = torch.randn(2, 8, 1, 12, 10)
        cache.begin_chunk()
        whole = _padded_conv(conv, torch.cat([x, nxt], 2))
        assert (cache.stream(conv, nxt) - whole[:, :, 1:]).abs().max().item() <= TOL


def test_last_chunk_stores_no_tails():
    torch.manual_seed(0)
    conv = CausalConv3d(4, 4, 3, padding=1)
    x = torch.randn(1, 4, 2, 6, 6)
    cache = CausalCache()
    with torch.inference_mode():
        cache.begin_chunk()
        cache.stream(conv, x)
        tail = cache.get(0)
        cache.begin_chunk(last=True)
        out = cache.stream(conv, x)
        assert cache.get(0) is tail  # read, not replaced by a copy of this chunk's end
        whole = _padded_conv(conv, torch.cat([x, x], 2))
        assert (out - whole[:, :, 2:]).abs().max().item() <= TOL
