"""A weight kept in one of ggml's block-quantized formats: its raw bytes, format name and logical shape.

GGUF quantizes along the last dim, so every row of the logical tensor is a whole number of blocks: splitting
or concatenating along dim 0 (fused qkv projections, reordered modulation rows) works on the bytes directly,
without dequantizing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from vidloom.layers.ggml_blocks import BLOCK_FORMATS, dequantize_blocks

DEQUANT_CHUNK = 1 << 22  # values dequantized at a time (16 MiB of float32)


def packed_row_bytes(qtype: str, width: int) -> int:
    """Bytes a row of `width` values takes in `qtype`; ValueError when `width` is not whole blocks."""
    block_size, type_size, _ = BLOCK_FORMATS[qtype]
    if width % block_size:
        raise ValueError(f"a {qtype} row holds whole blocks of {block_size} values, got a row of {width}")
    return width // block_size * type_size


@dataclass(frozen=True)
class QuantizedWeight:
    """A block-quantized tensor of logical shape `shape`, dequantized on demand."""

    data: Tensor
    """uint8 [*shape[:-1], bytes per row]: the blocks exactly as the file stores them."""
    qtype: str
    """The ggml format name, a key of ggml_blocks.BLOCK_FORMATS ("Q8_0", "Q4_K", ...)."""
    shape: tuple[int, ...]
    """The logical (dequantized) shape, in torch's dim order."""

    def __post_init__(self) -> None:
        if self.qtype not in BLOCK_FORMATS:
            raise ValueError(f"unknown quantization {self.qtype!r}; known: {', '.join(BLOCK_FORMATS)}")
        expected = (*self.shape[:-1], packed_row_bytes(self.qtype, self.shape[-1]))
        if self.data.dtype != torch.uint8 or tuple(self.data.shape) != expected:
            raise ValueError(f"{self.qtype} {self.shape} needs uint8 bytes {expected}, "
                             f"got {self.data.dtype} {tuple(self.data.shape)}")

    @property
    def nbytes(self) -> int:
        return self.data.numel()

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> Tensor:
        """The tensor in `dtype` (computed in float32, rounded once), on the bytes' device.

        Large tensors go DEQUANT_CHUNK values at a time into the output: the float32 values and the unpacking
        temporaries (several times the float32 size) then exist for one chunk only, not for the whole weight."""
        block_size, type_size, _ = BLOCK_FORMATS[self.qtype]
        blocks = self.data.reshape(-1, type_size)
        step = max(1, DEQUANT_CHUNK // block_size)
        if blocks.shape[0] <= step:
            return dequantize_blocks(self.qtype, blocks).reshape(self.shape).to(dtype)
        out = torch.empty((blocks.shape[0], block_size), dtype=dtype, device=blocks.device)
        for start in range(0, blocks.shape[0], step):
            out[start:start + step] = dequantize_blocks(self.qtype, blocks[start:start + step])
        return out.reshape(self.shape)

    def split_rows(self, sizes: list[int]) -> list[QuantizedWeight]:
        """Split along dim 0 into pieces of `sizes` rows (they must sum to shape[0])."""
        if sum(sizes) != self.shape[0]:
            raise ValueError(f"row sizes {sizes} do not sum to {self.shape[0]}")
        return [QuantizedWeight(part, self.qtype, (n, *self.shape[1:]))
                for part, n in zip(self.data.split(sizes, dim=0), sizes)]

    def to(self, device: torch.device | str) -> QuantizedWeight:
        return QuantizedWeight(self.data.to(device), self.qtype, self.shape)

    @classmethod
    def cat_rows(cls, parts: list[QuantizedWeight]) -> QuantizedWeight:
        """The module function `cat_rows`, reachable from the type (key_layout's row ops are duck-typed)."""
        return cat_rows(parts)


def cat_rows(parts: list[QuantizedWeight]) -> QuantizedWeight:
    """Concatenate along dim 0; every part must share the format and the trailing shape."""
    if not parts:
        raise ValueError("cat_rows needs at least one part")
    first = parts[0]
    for part in parts[1:]:
        if part.qtype != first.qtype or part.shape[1:] != first.shape[1:]:
            raise ValueError(f"cannot concatenate {part.qtype} {part.shape} onto {first.qtype} {first.shape}")
    rows = sum(part.shape[0] for part in parts)
    return QuantizedWeight(torch.cat([part.data for part in parts]), first.qtype, (rows, *first.shape[1:]))
