"""Read a GGUF file's tensors: plain float tensors as torch tensors, block-quantized ones as QuantizedWeight.

GGUF lists a tensor's dims innermost first (ggml's ne[0] is the row length); everything returned here is in
torch's order. Quantized bytes are memory-mapped copy-on-write rather than copied, so reading a file makes
no second resident copy of it (the pages are the file's, shared with the page cache).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from vidloom.core.errors import CheckpointError
from vidloom.layers.ggml_blocks import BLOCK_FORMATS
from vidloom.layers.quantized_weight import QuantizedWeight

INSTALL_HINT = "pip install 'vidloom[gguf]'"
PLAIN_TYPES = ("F32", "F16", "BF16")


def _gguf() -> Any:
    try:
        import gguf
    except ImportError:
        raise CheckpointError(f"reading .gguf files needs the 'gguf' package: {INSTALL_HINT}") from None
    return gguf


class _BadTensor(Exception):
    def __init__(self, name: str, reason: str) -> None:
        super().__init__(reason)
        self.name = name


def _reader(path: Path) -> Any:
    """gguf's reader, with a tensor the file cannot hold (cut short, unknown type) reported by name."""
    gguf = _gguf()

    class NamingReader(gguf.GGUFReader):
        # The stock reader builds every tensor view in its constructor and fails without a name; building them
        # one at a time lets the error say which tensor is cut short or of an unknown type.
        def _build_tensors(self, start_offs: int, fields: list) -> None:
            built = []
            for field in fields:
                try:
                    super()._build_tensors(start_offs, [field])
                except ValueError as exc:
                    raise _BadTensor(bytes(field.parts[1]).decode(errors="replace"), str(exc)) from None
                built += self.tensors
            self.tensors = built

    try:
        return NamingReader(str(path), mode="c")
    except _BadTensor as exc:
        raise CheckpointError(f"{path}: tensor {exc.name!r} cannot be read ({exc}); the file may be truncated "
                              "or use a quantization this reader does not know") from None
    except (ValueError, OSError, IndexError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: not a readable GGUF file ({exc}); download it again") from None


def read_gguf(path: Path) -> dict[str, torch.Tensor | QuantizedWeight]:
    """Every tensor in the GGUF file at `path`, by its stored name, in torch dim order.

    F32/F16/BF16 come back as torch tensors of that dtype; the block-quantized formats of
    ggml_blocks.BLOCK_FORMATS as QuantizedWeight. Any other type, a duplicate name or a file cut short
    raises CheckpointError naming the file and the tensor.
    """
    tensors: dict[str, torch.Tensor | QuantizedWeight] = {}
    for tensor in _reader(path).tensors:
        if tensor.name in tensors:
            raise CheckpointError(f"{path}: tensor {tensor.name!r} is stored twice")
        tensors[tensor.name] = _to_torch(path, tensor)
    return tensors


def _to_torch(path: Path, tensor: Any) -> torch.Tensor | QuantizedWeight:
    qtype = tensor.tensor_type.name
    shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
    data = tensor.data
    if qtype in ("F32", "F16"):
        return torch.from_numpy(data).reshape(shape)
    if qtype == "BF16":  # stored as raw bytes: reinterpret pairs as bfloat16
        return torch.from_numpy(np.ascontiguousarray(data)).view(torch.bfloat16).reshape(shape)
    if qtype not in BLOCK_FORMATS:
        known = ", ".join((*PLAIN_TYPES, *BLOCK_FORMATS))
        raise CheckpointError(f"{path}: tensor {tensor.name!r} is {qtype}, which vidloom cannot dequantize "
                              f"(supported: {known})")
    try:
        return QuantizedWeight(torch.from_numpy(data), qtype, shape)
    except ValueError as exc:
        raise CheckpointError(f"{path}: tensor {tensor.name!r}: {exc}") from None
