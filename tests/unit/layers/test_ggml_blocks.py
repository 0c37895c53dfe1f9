"""Our torch dequantizers against the `gguf` package's numpy reference, bit for bit in float32."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from tests.helpers.gguf_files import GGUF_QUANTIZES, random_blocks
from vidloom.layers.ggml_blocks import BLOCK_FORMATS, dequantize_blocks
from vidloom.layers.quantized_weight import QuantizedWeight, cat_rows


@pytest.mark.parametrize("qtype", sorted(BLOCK_FORMATS))
def test_random_blocks_match_gguf_reference_exactly(qtype: str) -> None:
    # Random bytes cover every quant value and every packed sub-scale; the float32 products are done in
    # ggml's order on both sides, so equality is exact, not approximate.
    blocks = random_blocks(qtype, 64, seed=len(qtype) + ord(qtype[1]))
    ours = dequantize_blocks(qtype, torch.from_numpy(blocks)).numpy()
    reference = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType[qtype])
    assert ours.dtype == np.float32
    np.testing.assert_array_equal(ours, reference.reshape(ours.shape))


@pytest.mark.parametrize("qtype", GGUF_QUANTIZES)
def test_quantized_tensor_round_trips_near_the_original(qtype: str) -> None:
    # A real tensor through gguf's quantizer and our dequantizer lands within the format's step size.
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(8, 64, generator=g)
    data = gguf.quants.quantize(weight.numpy(), gguf.GGMLQuantizationType[qtype])
    restored = QuantizedWeight(torch.from_numpy(data), qtype, (8, 64)).dequantize()
    step = (weight.abs().max() / (127 if qtype == "Q8_0" else 7)).item()
    assert (restored - weight).abs().max().item() <= step


def test_split_and_cat_rows_work_on_bytes() -> None:
    blocks = random_blocks("Q4_K", 6, seed=1)  # 6 rows of one 256-value block
    weight = QuantizedWeight(torch.from_numpy(blocks), "Q4_K", (6, 256))
    q, k, v = weight.split_rows([2, 2, 2])
    assert q.shape == (2, 256) and q.nbytes == 2 * 144
    torch.testing.assert_close(k.dequantize(), weight.dequantize()[2:4], rtol=0, atol=0)
    swapped = cat_rows([v, q, k])
    torch.testing.assert_close(swapped.dequantize(), torch.cat([weight.dequantize()[4:], weight.dequantize()[:4]]),
                               rtol=0, atol=0)


def test_bad_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match="whole blocks of 32"):
        QuantizedWeight(torch.zeros(2, 34, dtype=torch.uint8), "Q8_0", (2, 48))
    with pytest.raises(ValueError, match="unknown quantization 'IQ4_XS'"):
        QuantizedWeight(torch.zeros(2, 34, dtype=torch.uint8), "IQ4_XS", (2, 32))
    q8 = QuantizedWeight(torch.zeros(2, 34, dtype=torch.uint8), "Q8_0", (2, 32))
    with pytest.raises(ValueError, match="cannot concatenate"):
        cat_rows([q8, QuantizedWeight(torch.zeros(2, 40, dtype=torch.uint8), "Q4_1", (2, 64))])


def test_chunked_dequantization_equals_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    import vidloom.layers.quantized_weight as qw

    weight = QuantizedWeight(torch.from_numpy(random_blocks("Q5_K", 12, seed=4)).reshape(3, 704), "Q5_K", (3, 1024))
    whole = weight.dequantize(torch.bfloat16)
    monkeypatch.setattr(qw, "DEQUANT_CHUNK", 512)  # two blocks a chunk, the last chunk whole
    torch.testing.assert_close(weight.dequantize(torch.bfloat16), whole, rtol=0, atol=0)


@pytest.mark.parametrize("qtype", sorted(BLOCK_FORMATS))
def test_diffusers_dequantizers_agree_at_float32_and_round_at_float16(qtype: str) -> None:
    # The second reference (diffusers' GGUF support): exact when asked for float32; its default (no dtype, as
    # its GGUFLinear calls it) computes in float16, off by float16 rounding: up to ~8e-4 of the values' range.
    from diffusers.quantizers.gguf.utils import dequantize_functions

    block_size, type_size, _ = BLOCK_FORMATS[qtype]
    blocks = torch.from_numpy(random_blocks(qtype, 64, seed=5))
    fn = dequantize_functions[gguf.GGMLQuantizationType[qtype]]
    ours = dequantize_blocks(qtype, blocks)
    torch.testing.assert_close(fn(blocks, block_size, type_size, dtype=torch.float32), ours, rtol=0, atol=0)
    shipped = fn(blocks, block_size, type_size)
    assert shipped.dtype == torch.float16
    assert (shipped.float() - ours).abs().max() <= 2e-3 * ours.abs().max()
