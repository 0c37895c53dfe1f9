"""Tiny GGUF files for tests: valid random ggml blocks and state dicts written with `gguf.GGUFWriter`.

The `gguf` package quantizes Q8_0 and the 32-value formats itself; it has no K-quant quantizer, so K-quant
tensors are written as random blocks whose float16 scale fields are set to sane values (random bytes there
could read as inf or NaN) - the file stays a valid GGUF that every reader must decode the same way.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import torch
from safetensors.torch import load_file

from tests.helpers.single_files import to_original
from vidloom.layers.ggml_blocks import BLOCK_FORMATS
from vidloom.loading.key_layout import KeyLayout

# Byte offsets of each format's float16 scale fields inside a block (ggml-common.h's block_* structs).
F16_FIELDS: dict[str, tuple[int, ...]] = {
    "Q8_0": (0,), "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2),
    "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,),
}
GGUF_QUANTIZES = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1")  # formats gguf.quants.quantize writes
# A K-quant value is at most about f16 scale x sub-scale x quant: these products, so random blocks can be
# scaled to the magnitude of the tensor they stand for.
K_RANGE = {"Q2_K": 15 * 3, "Q3_K": 32 * 4, "Q4_K": 63 * 15, "Q5_K": 63 * 31, "Q6_K": 128 * 32}


def random_blocks(qtype: str, n_blocks: int, seed: int, scale: float = 0.01) -> np.ndarray:
    """uint8 [n_blocks, bytes per block]: random quants, float16 scales in +-[scale/2, scale]."""
    _, type_size, _ = BLOCK_FORMATS[qtype]
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    for offset in F16_FIELDS[qtype]:
        values = (rng.uniform(0.5, 1.0, n_blocks) * rng.choice([-1.0, 1.0], n_blocks) * scale).astype(np.float16)
        blocks[:, offset:offset + 2] = values.view(np.uint8).reshape(n_blocks, 2)
    return blocks


def quantize_like_file(tensor: torch.Tensor, qtype: str, seed: int) -> np.ndarray:
    """The bytes a GGUF file holds for `tensor` in `qtype`, shape [*torch shape[:-1], bytes per row].

    32-value formats: gguf's own quantizer. K-quants: random blocks with scales sized to the tensor's
    spread (the values change, which parity tests do not mind: both sides read the same file)."""
    data = tensor.detach().float().numpy()
    if qtype in GGUF_QUANTIZES:
        return gguf.quants.quantize(data, gguf.GGMLQuantizationType[qtype])
    block_size, type_size, _ = BLOCK_FORMATS[qtype]
    rows = data.reshape(-1, data.shape[-1])
    n_blocks = rows.size // block_size
    spread = float(np.abs(rows).max()) or 1.0
    blocks = random_blocks(qtype, n_blocks, seed, scale=spread / K_RANGE[qtype])
    return blocks.reshape(*data.shape[:-1], data.shape[-1] // block_size * type_size)


def write_gguf(path: Path, tensors: dict[str, torch.Tensor], qtype: str, quantize_also: tuple[str, ...] = (),
               arch: str = "wan", seed: int = 0) -> Path:
    """Write `tensors` to a GGUF file as real converters do (city96's ComfyUI-GGUF tools): 2-D `*.weight`
    tensors whose rows are whole `qtype` blocks quantized (the linears: ~all the bytes), the rest - norms,
    biases, modulation tables, convolutions - as float32 (1-D) or float16. `quantize_also` names other
    tensors to quantize (a loader must dequantize those)."""
    writer = gguf.GGUFWriter(str(path), arch)
    block_size = BLOCK_FORMATS[qtype][0]
    for i, (key, tensor) in enumerate(tensors.items()):
        linear = key.endswith(".weight") and tensor.dim() == 2
        quantize = (linear or key in quantize_also) and tensor.shape[-1] % block_size == 0
        if quantize:
            data = quantize_like_file(tensor, qtype, seed + i)
            writer.add_tensor(key, data, raw_shape=data.shape, raw_dtype=gguf.GGMLQuantizationType[qtype])
        elif tensor.dim() <= 1:
            writer.add_tensor(key, tensor.detach().float().numpy())
        else:
            writer.add_tensor(key, tensor.detach().to(torch.float16).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def transformer_gguf(folder: Path, layout: KeyLayout, qtype: str, prefix: str = "") -> Path:
    """`folder`'s transformer weights as a GGUF file in `layout`'s original key names (the layout real GGUF
    transformers use: city96's Wan/FLUX files keep the release's names), `qtype` for the linears."""
    state = load_file(str(folder / "transformer" / "diffusion_pytorch_model.safetensors"))
    return write_gguf(folder / f"transformer-{qtype}.gguf", to_original(layout, state, prefix), qtype)
