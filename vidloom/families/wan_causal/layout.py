"""Where each token of a FAR sequence sits: chunks, compressed far context, RoPE tables, masks.

A FAR sequence for chunk k (k + 1 chunks so far) holds its oldest chunks as
compressed tokens (a coarser patch embedding) followed by the newest
`full_chunk_limit` chunks at full resolution; the last chunk is the one being
generated. The KV cache holds everything before the last chunk, so the same
layout describes both the cache-prefill pass and the generation steps.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch
from torch import Tensor

from vidloom.core.errors import InvalidRequest
from vidloom.models.wan.ops import rope_tables
from vidloom.families.wan_causal.config import FarTransformerConfig

# The reference runs generation-step attention through flex_attention with the
# sequence padded up to this block size and no mask, so the generated chunk's
# queries also see that many all-zero keys (value 0, logit 0). The released
# pipeline samples that way; we reproduce it so outputs match (see null_keys).
REFERENCE_BLOCK = 128


@dataclass(frozen=True)
class ChunkLayout:
    """Token layout of one FAR forward: chunks[:-1] are context, chunks[-1] is generated."""

    chunks: tuple[int, ...]
    """Latent frames of every chunk up to and including the generated one."""
    num_compressed_chunks: int
    """Leading chunks embedded at the compressed patch size."""
    full_grid: tuple[int, int]
    """Patches per frame (h, w) at full resolution."""
    compressed_grid: tuple[int, int]
    """Patches per frame (h, w) at the compressed patch size."""

    @classmethod
    def for_chunk(
        cls, partition: tuple[int, ...], index: int, latent_hw: tuple[int, int], config: FarTransformerConfig
    ) -> ChunkLayout:
        """Layout for generating chunk `index` of `partition` on latents of spatial size `latent_hw`."""
        if not 0 <= index < len(partition):
            raise ValueError(f"chunk index {index} outside partition {partition}")
        height, width = latent_hw
        _, p_h, p_w = config.wan.patch_size
        _, c_h, c_w = config.compressed_patch_size
        if height % p_h or width % p_w:
            raise ValueError(f"latent size {latent_hw} is not divisible by patch_size {config.wan.patch_size}")
        _check_rope_range((sum(partition), height // p_h, width // p_w), config.wan.rope_max_seq_len)
        chunks = tuple(partition[: index + 1])
        return cls(
            chunks=chunks,
            num_compressed_chunks=max(0, len(chunks) - config.full_chunk_limit),
            full_grid=(height // p_h, width // p_w),
            # Floor, as the strided convolution does: a remainder row is dropped.
            compressed_grid=(height // c_h, width // c_w),
        )

    # -- frames ---------------------------------------------------------------

    @property
    def compressed_frames(self) -> int:
        return sum(self.chunks[: self.num_compressed_chunks])

    @property
    def context_frames(self) -> int:
        return sum(self.chunks[:-1])

    @property
    def total_frames(self) -> int:
        return sum(self.chunks)

    @property
    def generated_frames(self) -> int:
        return self.chunks[-1]

    # -- tokens ---------------------------------------------------------------

    @property
    def full_tokens_per_frame(self) -> int:
        return self.full_grid[0] * self.full_grid[1]

    @property
    def compressed_tokens_per_frame(self) -> int:
        return self.compressed_grid[0] * self.compressed_grid[1]

    @property
    def compressed_tokens(self) -> int:
        return self.compressed_frames * self.compressed_tokens_per_frame

    @property
    def context_tokens(self) -> int:
        """Tokens in the KV cache while this chunk is generated (compressed, then full context)."""
        full_context = self.context_frames - self.compressed_frames
        return self.compressed_tokens + full_context * self.full_tokens_per_frame

    @property
    def generated_tokens(self) -> int:
        return self.generated_frames * self.full_tokens_per_frame

    @property
    def total_tokens(self) -> int:
        return self.context_tokens + self.generated_tokens

    @property
    def null_keys(self) -> int:
        """All-zero keys the generated chunk's queries attend to, as the reference's padded attention does."""
        return math.ceil(self.generated_tokens / REFERENCE_BLOCK) * REFERENCE_BLOCK - self.generated_tokens

    def frame_tokens(self) -> list[int]:
        """Tokens per latent frame, in sequence order."""
        return [
            self.compressed_tokens_per_frame if f < self.compressed_frames else self.full_tokens_per_frame
            for f in range(self.total_frames)
        ]

    def chunk_tokens(self) -> list[int]:
        """Tokens of each chunk, in sequence order (the segments sequence parallel splits one by one)."""
        ends = self.chunk_ends()
        return [end - start for start, end in zip([0, *ends[:-1]], ends)]

    def chunk_ends(self) -> list[int]:
        """Token index where each chunk ends, in sequence order (the last equals total_tokens).

        Attention is block-causal: a chunk's tokens see every token before its end.
        """
        ends, frame, tokens = [], 0, 0
        per_frame = self.frame_tokens()
        for frames in self.chunks:
            tokens += sum(per_frame[frame : frame + frames])
            frame += frames
            ends.append(tokens)
        return ends

    # -- rotary tables ----------------------------------------------------------

    def rope(self, head_dim: int, downscale: tuple[int, int], device: torch.device) -> tuple[Tensor, Tensor]:
        """cos/sin [S, head_dim // 2] for every token: compressed frames, then full frames.

        Frames keep their absolute index on the time axis; compressed tokens take the
        unit-normalised mean of the full-resolution rotations they cover (a complex
        average pool), so the coarse grid stays aligned with the fine one.
        """
        full_cos, full_sin = rope_tables((self.total_frames, *self.full_grid), head_dim, device)
        skip = self.compressed_frames * self.full_tokens_per_frame
        full = (full_cos[skip:], full_sin[skip:])
        if self.compressed_frames == 0:
            return full
        comp = compressed_rope_tables((self.compressed_frames, *self.compressed_grid), head_dim, downscale, device)
        return torch.cat([comp[0], full[0]]), torch.cat([comp[1], full[1]])


def per_token(x: Tensor, frame_tokens: list[int]) -> Tensor:
    """Per-frame rows x [B, F, ...] -> per-token rows [B, S, ...]: frame f repeated `frame_tokens[f]` times.

    By runs of frames with equal counts, each repeated by a Python int: no count tensor is copied to the device and
    no output length is read back from it, so a captured CUDA graph can hold it; the rows equal repeat_interleave's
    with a count tensor.
    """
    parts, start = [], 0
    for count, run in itertools.groupby(frame_tokens):
        frames = len(list(run))
        parts.append(x[:, start : start + frames].repeat_interleave(count, dim=1))
        start += frames
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)


def _check_rope_range(grid: tuple[int, int, int], limit: int) -> None:
    """The reference's RoPE tables stop at rope_max_seq_len positions per axis (it fails past them)."""
    for field, extent in zip(("num_frames", "height", "width"), grid):
        if extent > limit:
            raise InvalidRequest(
                field, f"{extent} latent positions along {field} exceed the checkpoint's rope_max_seq_len={limit}"
            )


def compressed_rope_tables(
    grid: tuple[int, int, int], head_dim: int, downscale: tuple[int, int], device: torch.device,
    theta: float = 10000.0,
) -> tuple[Tensor, Tensor]:
    """cos/sin [f*h*w, head_dim // 2] for a compressed (frames, height, width) grid, float32.

    Each compressed position along height/width averages the unit rotations of the
    `downscale` full-resolution positions it covers and renormalises to unit length.
    Follows the reference's pooling (AnyFlowCausalRotaryPosEmbed) step for step, in float64.
    """
    hw_dim = 2 * (head_dim // 6)
    axis_dims = (head_dim - 2 * hw_dim, hw_dim, hw_dim)
    pools = (1, *downscale)
    per_axis: list[tuple[Tensor, Tensor]] = []
    for extent, dim, pool in zip(grid, axis_dims, pools):
        inv_freq = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64, device=device) / dim)
        positions = torch.arange(extent * pool, dtype=torch.float64, device=device)
        angles = torch.outer(positions, inv_freq).unflatten(0, (extent, pool))  # [extent, pool, dim/2]
        re, im = angles.cos().mean(1), angles.sin().mean(1)
        norm = torch.sqrt(re**2 + im**2)
        per_axis.append((re / norm, im / norm))
    frames, height, width = grid

    def assemble(part: int) -> Tensor:
        t, h, w = (axis[part] for axis in per_axis)
        return torch.cat(
            [
                t[:, None, None, :].expand(frames, height, width, -1),
                h[None, :, None, :].expand(frames, height, width, -1),
                w[None, None, :, :].expand(frames, height, width, -1),
            ],
            dim=-1,
        ).reshape(frames * height * width, head_dim // 2)

    return assemble(0).float(), assemble(1).float()
