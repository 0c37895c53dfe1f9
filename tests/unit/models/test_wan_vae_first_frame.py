"""The Wan VAE's one-frame shortcuts: a causal conv of a lone frame with nothing before it as the 2D conv of its last
time tap, the nearest 2x upsampling written channels-last, and no tail copied on a call's last chunk."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vidloom.models.wan.vae_blocks import CausalCache, CausalConv3d, _nearest_2x

# float32 reordering of the same sums (the 3D conv adds the zero padding's exact zeros too).
TOL = 1e-5


def test_lone_frame_conv_is_the_padded_3d_conv():
    torch.manual_seed(0)
    conv = CausalConv3d(8, 6, 3, padding=1)
    x = torch.randn(2, 8, 1, 12, 10).contiguous(memory_format=torch.channels_last_3d)
    with torch.inference_mode():
        expected = F.conv3d(F.pad(x, (0, 0, 0, 0, 2, 0)), conv.weight, conv.bias, padding=(0, 1, 1))
        for past in (None, x[:, :, :0]):
            got = conv(x, past)
            assert got.shape == expected.shape == (2, 6, 1, 12, 10)
            assert (got - expected).abs().max().item() <= TOL
        # With frames before it the conv reads them: the 3D path, not the shortcut.
        past = torch.randn(2, 8, 2, 12, 10)
        full = F.conv3d(torch.cat([past, x], 2), conv.weight, conv.bias, padding=(0, 1, 1))
        assert (conv(x, past) - full).abs().max().item() <= TOL


def test_nearest_2x_is_nearest_exact_and_channels_last():
    x = torch.randn(2, 5, 7, 3)
    for frames in (x, x.contiguous(memory_format=torch.channels_last), x.permute(0, 1, 3, 2).transpose(2, 3)):
        got = _nearest_2x(frames)
        assert torch.equal(got, F.interpolate(frames, scale_factor=2.0, mode="nearest-exact"))
        assert got.is_contiguous(memory_format=torch.channels_last)


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
        whole = F.conv3d(F.pad(torch.cat([x, x], 2), (0, 0, 0, 0, 2, 0)), conv.weight, conv.bias, padding=(0, 1, 1))
        assert (out - whole[:, :, 2:]).abs().max().item() <= TOL
