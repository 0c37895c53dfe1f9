"""LTX-2's patch order: video latents <-> the transformer's token sequence."""

from __future__ import annotations

from torch import Tensor


def pack_video(latents: Tensor, p: int, pt: int) -> Tensor:
    """[B, C, F, H, W] -> [B, F/pt * H/p * W/p, C * pt * p * p]."""
    b, c, f, h, w = latents.shape
    x = latents.reshape(b, c, f // pt, pt, h // p, p, w // p, p)
    return x.permute(0, 2, 4, 6, 1, 3, 5, 7).flatten(4, 7).flatten(1, 3)


def unpack_video(tokens: Tensor, frames: int, height: int, width: int, p: int, pt: int) -> Tensor:
    """Inverse of pack_video, with frames/height/width in patches."""
    b = tokens.shape[0]
    x = tokens.reshape(b, frames, height, width, -1, pt, p, p)
    return x.permute(0, 4, 1, 5, 2, 6, 3, 7).flatten(6, 7).flatten(4, 5).flatten(2, 3)
