"""read_gguf: dims in torch order, plain floats as tensors, quantized as QuantizedWeight, bad files named."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from tests.helpers.gguf_files import random_blocks
from vidloom.core.errors import CheckpointError
from vidloom.loading.gguf_file import read_gguf


def _write(path: Path, arrays: dict[str, tuple[np.ndarray, str | None]]) -> Path:
    writer = gguf.GGUFWriter(str(path), "wan")
    for name, (data, raw) in arrays.items():
        if raw is None:
            writer.add_tensor(name, data)
        else:
            writer.add_tensor(name, data, raw_shape=data.shape, raw_dtype=gguf.GGMLQuantizationType[raw])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_plain_and_quantized_tensors_come_back_in_torch_order(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(0)
    norm = torch.randn(48, generator=g)
    conv = torch.randn(6, 4, 1, 2, 2, generator=g).half()
    bf16 = torch.randn(3, 5, generator=g).bfloat16()
    q8 = torch.randn(4, 64, generator=g)
    q8_bytes = gguf.quants.quantize(q8.numpy(), gguf.GGMLQuantizationType.Q8_0)
    k4 = random_blocks("Q4_K", 6, seed=3).reshape(3, 2 * 144)
    path = _write(tmp_path / "t.gguf", {
        "norm.weight": (norm.numpy(), None),
        "conv.weight": (conv.numpy(), None),
        "bf16.weight": (bf16.view(torch.int16).numpy().view(np.uint8).reshape(3, 10), "BF16"),
        "q8.weight": (q8_bytes, "Q8_0"),
        "k4.weight": (k4, "Q4_K"),
    })
    tensors = read_gguf(path)
    torch.testing.assert_close(tensors["norm.weight"], norm, rtol=0, atol=0)
    torch.testing.assert_close(tensors["conv.weight"], conv, rtol=0, atol=0)
    torch.testing.assert_close(tensors["bf16.weight"], bf16, rtol=0, atol=0)
    q8_read, k4_read = tensors["q8.weight"], tensors["k4.weight"]
    assert (q8_read.qtype, q8_read.shape, q8_read.nbytes) == ("Q8_0", (4, 64), 4 * 2 * 34)
    np.testing.assert_array_equal(q8_read.dequantize().numpy(), gguf.quants.dequantize(q8_bytes, gguf.GGMLQuantizationType.Q8_0))
    assert (k4_read.qtype, k4_read.shape) == ("Q4_K", (3, 512))


def test_truncated_file_names_the_tensor(tmp_path: Path) -> None:
    path = _write(tmp_path / "t.gguf", {
        "a.weight": (np.ones((4, 64), np.float32), None),
        "b.weight": (random_blocks("Q6_K", 8, seed=0).reshape(4, 420), "Q6_K"),
    })
    path.write_bytes(path.read_bytes()[:-200])
    with pytest.raises(CheckpointError, match=r"t\.gguf: tensor 'b\.weight' cannot be read .*truncated"):
        read_gguf(path)


def test_unsupported_quantization_and_garbage_are_refused(tmp_path: Path) -> None:
    path = _write(tmp_path / "iq.gguf", {"blk.weight": (np.zeros((2, 136), np.uint8), "IQ4_XS")})
    with pytest.raises(CheckpointError, match=r"iq\.gguf: tensor 'blk\.weight' is IQ4_XS, which vidloom cannot "
                                              r"dequantize \(supported: F32, F16, BF16, Q8_0"):
        read_gguf(path)
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(CheckpointError, match=r"junk\.gguf: not a readable GGUF file"):
        read_gguf(junk)


def test_missing_gguf_package_says_how_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "gguf", None)  # `import gguf` raises ImportError
    with pytest.raises(CheckpointError, match=r"needs the 'gguf' package: pip install 'vidloom\[gguf\]'"):
        read_gguf(tmp_path / "any.gguf")
