"""Chunk-by-chunk VAE decode equals decoding the whole latent at once (the causal state carries over)."""

from __future__ import annotations

import pytest
import torch

from vidloom.models.wan.vae import WanVAE, WanVAEConfig
from vidloom.models.wan.vae_stream import StreamingDecode

ARCHS = {
    "wan21_time_up_late": dict(base_dim=8, z_dim=4, dim_mult=(1, 2, 2, 2), num_res_blocks=1),
    "time_up_early": dict(base_dim=8, z_dim=4, dim_mult=(1, 2, 2, 2), num_res_blocks=1,
                          temporal_downsample=(True, True, False)),
}


def _vae(arch: dict) -> WanVAE:
    torch.manual_seed(0)
    vae = WanVAE(WanVAEConfig(**arch, latents_mean=(0.0,) * 4, latents_std=(1.0,) * 4)).eval()
    with torch.no_grad():  # move norm gains and biases off their init values so every path is live
        for p in vae.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return vae


@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("partition", [(1, 2, 2), (1, 1, 2, 1), (3, 2)])
def test_chunked_decode_equals_whole_decode(arch: str, partition: tuple[int, ...]) -> None:
    vae = _vae(ARCHS[arch])
    latents = torch.randn(1, 4, sum(partition), 3, 4, generator=torch.Generator().manual_seed(1))
    whole = vae.decode(latents)
    stream = StreamingDecode(vae)
    pieces, start = [], 0
    for size in partition:
        piece = stream.decode(latents[:, :, start : start + size])
        # Frames per chunk follow the causal rule: the first latent frame gives one frame.
        assert piece.shape[2] == size * 4 - (3 if start == 0 else 0)
        pieces.append(piece)
        start += size
    assert stream.latent_frames == sum(partition)
    assert torch.equal(torch.cat(pieces, dim=2), whole)


def test_streams_are_independent() -> None:
    # Two videos decoded interleaved through one module keep their own causal state.
    vae = _vae(ARCHS["wan21_time_up_late"])
    a = torch.randn(1, 4, 3, 3, 4, generator=torch.Generator().manual_seed(2))
    b = torch.randn(1, 4, 3, 3, 4, generator=torch.Generator().manual_seed(3))
    sa, sb = StreamingDecode(vae), StreamingDecode(vae)
    out_a, out_b = [], []
    for index in range(3):
        out_a.append(sa.decode(a[:, :, index : index + 1]))
        out_b.append(sb.decode(b[:, :, index : index + 1]))
    assert torch.equal(torch.cat(out_a, dim=2), vae.decode(a))
    assert torch.equal(torch.cat(out_b, dim=2), vae.decode(b))
