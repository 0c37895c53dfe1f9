"""Dequantization of ggml's block-quantized formats (the tensors inside GGUF files), in torch.

Each format packs a row's values in fixed-size blocks along the last dim: `BLOCK_FORMATS[name]` gives the
values per block and bytes per block, and `dequantize_blocks(name, blocks)` turns a uint8 tensor
[n_blocks, bytes_per_block] into float32 [n_blocks, values_per_block] on whatever device the bytes live.

The byte layouts and the arithmetic follow ggml's definitions step by step (the `block_*` structs in
ggml/src/ggml-common.h and the `dequantize_row_*` functions in ggml/src/ggml-quants.c, llama.cpp, MIT), as bit
parity with every other GGUF reader requires; the vectorised torch formulation is ours. Every product and sum
is done in float32 in the same order as ggml's scalar code (scale times quant, then minus the offset), so the
result equals the `gguf` package's numpy reference bit for bit (tests/unit/layers/test_ggml_blocks.py).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

QK_K = 256  # values per K-quant super-block (ggml's QK_K)


def _f16(blocks: Tensor, start: int) -> Tensor:
    """The float16 at byte `start` of each block, as float32 [n, 1]."""
    return blocks[:, start:start + 2].contiguous().view(torch.float16).float()


def _nibbles(packed: Tensor) -> Tensor:
    """[n, g, k] bytes -> [n, g, 2, k] nibbles: all low nibbles of the group first, then all high ones."""
    return torch.stack((packed & 0x0F, packed >> 4), dim=-2)


def _bits(packed: Tensor, count: int, width: int) -> Tensor:
    """[n, ..., k] bytes -> [n, ..., count, k]: field i is (byte >> i*width) & mask, for i < count."""
    shifts = torch.arange(0, count * width, width, dtype=torch.uint8, device=packed.device).view(count, 1)
    return (packed.unsqueeze(-2) >> shifts) & ((1 << width) - 1)


def _high_bits32(qh: Tensor) -> Tensor:
    """Q5_0/Q5_1's 4-byte little-endian bitmask -> [n, 32]: value j's fifth bit is bit j."""
    return _bits(qh, 8, 1).transpose(1, 2).reshape(qh.shape[0], 32)


def _q8_0(b: Tensor) -> Tensor:  # block_q8_0: f16 d; int8 qs[32]
    return b[:, 2:].contiguous().view(torch.int8).float() * _f16(b, 0)


def _q4_0(b: Tensor) -> Tensor:  # block_q4_0: f16 d; u8 qs[16] (value j low nibble, value j+16 high nibble)
    q = _nibbles(b[:, None, 2:]).reshape(-1, 32).to(torch.int8) - 8
    return _f16(b, 0) * q.float()


def _q4_1(b: Tensor) -> Tensor:  # block_q4_1: f16 d; f16 m; u8 qs[16]
    q = _nibbles(b[:, None, 4:]).reshape(-1, 32).float()
    return _f16(b, 0) * q + _f16(b, 2)


def _q5_0(b: Tensor) -> Tensor:  # block_q5_0: f16 d; u8 qh[4]; u8 qs[16]
    q = _nibbles(b[:, None, 6:]).reshape(-1, 32) | (_high_bits32(b[:, 2:6]) << 4)
    return _f16(b, 0) * (q.to(torch.int8) - 16).float()


def _q5_1(b: Tensor) -> Tensor:  # block_q5_1: f16 d; f16 m; u8 qh[4]; u8 qs[16]
    q = _nibbles(b[:, None, 8:]).reshape(-1, 32) | (_high_bits32(b[:, 4:8]) << 4)
    return _f16(b, 0) * q.float() + _f16(b, 2)


def _k4_scales(packed: Tensor) -> tuple[Tensor, Tensor]:
    """Q4_K/Q5_K's 12 bytes of eight 6-bit scales and eight 6-bit mins (ggml's get_scale_min_k4) -> 2 x [n, 8]."""
    d, m, low = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    scales = torch.cat((d & 0x3F, (low & 0x0F) | ((d >> 2) & 0x30)), dim=1)
    mins = torch.cat((m & 0x3F, (low >> 4) | ((m >> 2) & 0x30)), dim=1)
    return scales, mins


def _q4_k(b: Tensor) -> Tensor:  # block_q4_K: f16 d; f16 dmin; u8 scales[12]; u8 qs[128]
    scales, mins = _k4_scales(b[:, 4:16])
    d = (_f16(b, 0) * scales.float()).unsqueeze(-1)
    m = (_f16(b, 2) * mins.float()).unsqueeze(-1)
    q = _nibbles(b[:, 16:].reshape(-1, 4, 32)).reshape(-1, 8, 32).float()
    return (d * q - m).reshape(-1, QK_K)


def _q5_k(b: Tensor) -> Tensor:  # block_q5_K: f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]
    scales, mins = _k4_scales(b[:, 4:16])
    d = (_f16(b, 0) * scales.float()).unsqueeze(-1)
    m = (_f16(b, 2) * mins.float()).unsqueeze(-1)
    low = _nibbles(b[:, 48:].reshape(-1, 4, 32)).reshape(-1, 8, 32)
    q = (low | (_bits(b[:, 16:48], 8, 1) << 4)).float()  # sub-block k's fifth bit is bit k of qh
    return (d * q - m).reshape(-1, QK_K)


def _q6_k(b: Tensor) -> Tensor:  # block_q6_K: u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d
    low = _nibbles(b[:, :128].reshape(-1, 2, 64)).reshape(-1, 2, 4, 32)
    high = _bits(b[:, 128:192].reshape(-1, 2, 32), 4, 2)
    q = ((low | (high << 4)).to(torch.int8) - 32).reshape(-1, 16, 16).float()
    d = (_f16(b, 208) * b[:, 192:208].contiguous().view(torch.int8).float()).unsqueeze(-1)
    return (d * q).reshape(-1, QK_K)


def _q3_k(b: Tensor) -> Tensor:  # block_q3_K: u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d
    packed = b[:, 96:108]
    low = _bits(packed[:, :8], 2, 4).reshape(-1, 16)  # scale i < 8: low nibble of byte i; else high of byte i-8
    high = _bits(packed[:, 8:12], 4, 2).reshape(-1, 16)  # scale i: bits 2*(i//4) of byte 8 + i%4
    scales = ((low | (high << 4)).to(torch.int8) - 32).float()
    d = (_f16(b, 108) * scales).unsqueeze(-1)
    q = _bits(b[:, 32:96].reshape(-1, 2, 32), 4, 2).reshape(-1, 8, 32).to(torch.int8)
    # A cleared hmask bit subtracts 4 (ggml stores the offset inverted).
    q = q - ((_bits(b[:, :32], 8, 1) ^ 1) << 2).to(torch.int8)
    return (d * q.reshape(-1, 16, 16).float()).reshape(-1, QK_K)


def _q2_k(b: Tensor) -> Tensor:  # block_q2_K: u8 scales[16]; u8 qs[64]; f16 d; f16 dmin
    packed = b[:, :16]
    d = (_f16(b, 80) * (packed & 0x0F).float()).unsqueeze(-1)
    m = (_f16(b, 82) * (packed >> 4).float()).unsqueeze(-1)
    q = _bits(b[:, 16:80].reshape(-1, 2, 32), 4, 2).reshape(-1, 16, 16).float()
    return (d * q - m).reshape(-1, QK_K)


# name -> (values per block, bytes per block, dequantizer): ggml's GGML_QUANT_SIZES for these types.
BLOCK_FORMATS: dict[str, tuple[int, int, Callable[[Tensor], Tensor]]] = {
    "Q8_0": (32, 34, _q8_0),
    "Q4_0": (32, 18, _q4_0),
    "Q4_1": (32, 20, _q4_1),
    "Q5_0": (32, 22, _q5_0),
    "Q5_1": (32, 24, _q5_1),
    "Q2_K": (QK_K, 84, _q2_k),
    "Q3_K": (QK_K, 110, _q3_k),
    "Q4_K": (QK_K, 144, _q4_k),
    "Q5_K": (QK_K, 176, _q5_k),
    "Q6_K": (QK_K, 210, _q6_k),
}


def dequantize_blocks(qtype: str, blocks: Tensor) -> Tensor:
    """uint8 [n_blocks, bytes_per_block] of format `qtype` -> float32 [n_blocks, values_per_block]."""
    _, type_size, fn = BLOCK_FORMATS[qtype]
    if blocks.dtype != torch.uint8 or blocks.dim() != 2 or blocks.shape[1] != type_size:
        raise ValueError(f"{qtype} blocks must be uint8 [n, {type_size}], got {blocks.dtype} {tuple(blocks.shape)}")
    return fn(blocks)
