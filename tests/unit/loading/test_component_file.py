"""Component files: layout detection, FP8 with scales, and the errors a wrong, truncated or partial file gives."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.helpers.single_files import random_state, save, to_original, to_scaled_fp8
from tests.helpers.wan_checkpoints import TINY_A, TINY_B
from vidloom.core.errors import CheckpointError, DeployError
from vidloom.layers.attention import resolve_attention
from vidloom.loading.component_file import component_files, load_component_file
from vidloom.loading.key_layout import KeyLayout, RowSplit, swap_halves
from vidloom.families.flux2.original_layout import FLUX2_BFL
from vidloom.models.wan.original_layout import WAN_ORIGINAL
from vidloom.models.wan.transformer import WanTransformer
from vidloom.models.wan.transformer_config import WAN_TRANSFORMER_NAME_MAP, WanTransformerConfig

LAYOUTS = (WAN_ORIGINAL,)


def _reference_state(spec=TINY_A) -> dict[str, torch.Tensor]:
    from diffusers import WanTransformer3DModel

    torch.manual_seed(0)
    return random_state(WanTransformer3DModel(**spec.transformer), seed=3)


def _ours(dtype: torch.dtype = torch.float32, spec=TINY_A) -> WanTransformer:
    config = WanTransformerConfig.from_diffusers({"_class_name": "WanTransformer3DModel", **spec.transformer})
    return WanTransformer(config, resolve_attention("sdpa", torch.device("cpu"), dtype)).to(dtype)


def _load(path: Path, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    module = _ours(dtype)
    load_component_file(module, path, WAN_TRANSFORMER_NAME_MAP, LAYOUTS)
    return module.state_dict()


def _assert_loaded(ours: dict[str, torch.Tensor], state: dict[str, torch.Tensor]) -> None:
    for key, tensor in state.items():
        torch.testing.assert_close(ours[WAN_TRANSFORMER_NAME_MAP.to_module(key)], tensor.to(torch.float32),
                                   rtol=0, atol=0, msg=key)


def test_a_diffusers_layout_file_loads(tmp_path):
    state = _reference_state()
    _assert_loaded(_load(save(state, tmp_path / "t.safetensors")), state)


@pytest.mark.parametrize("prefix", ["", "model.diffusion_model."])
def test_an_original_layout_file_loads_the_same_weights(tmp_path, prefix):
    state = _reference_state()
    path = save(to_original(WAN_ORIGINAL, state, prefix), tmp_path / "t.safetensors")
    _assert_loaded(_load(path), state)


def test_flf2v_image_positions_load_from_the_original_layout(tmp_path):
    """Wan2.1 FLF2V's `img_emb.emb_pos` (diffusers' converter has no rule for it; ours maps it to pos_embed)."""
    from diffusers import WanTransformer3DModel

    from tests.helpers.wan_i2v_checkpoints import i2v_transformer_kwargs

    kwargs = i2v_transformer_kwargs(TINY_A, first_last=True)
    state = random_state(WanTransformer3DModel(**kwargs), seed=4)
    original = to_original(WAN_ORIGINAL, state)
    assert "img_emb.emb_pos" in original and "img_emb.proj.1.weight" in original
    config = WanTransformerConfig.from_diffusers({"_class_name": "WanTransformer3DModel", **kwargs})
    module = WanTransformer(config, resolve_attention("sdpa", torch.device("cpu"), torch.float32))
    load_component_file(module, save(original, tmp_path / "flf2v.safetensors"), WAN_TRANSFORMER_NAME_MAP, LAYOUTS)
    _assert_loaded(module.state_dict(), state)


@pytest.mark.parametrize("style,per_row", [("scaled_fp8", False), ("mixed", False), ("mixed", True)])
def test_fp8_with_scales_loads_as_its_dequantized_weights(tmp_path, style, per_row):
    """ComfyUI's FP8 files (scaled_fp8 and mixed-precision spellings; per-tensor and per-row scales): weight.float()
    * scale, then the compute dtype; bit-exact vs the float32 file of the same dequantized values, in float32 and
    bfloat16."""
    original = to_original(WAN_ORIGINAL, _reference_state(), "model.diffusion_model.")
    fp8, exact = to_scaled_fp8(original, style, per_row)
    assert any(t.dtype == torch.float8_e4m3fn for t in fp8.values())
    for dtype in (torch.float32, torch.bfloat16):
        got = _load(save(fp8, tmp_path / "fp8.safetensors"), dtype)
        want = _load(save(exact, tmp_path / "exact.safetensors"), dtype)
        for key in want:
            torch.testing.assert_close(got[key], want[key], rtol=0, atol=0, msg=key)
    # The dequantization is real: the FP8 file's weights are not the float32 ones it was made from.
    assert any(not torch.equal(exact[k], original[k]) for k in original)


def test_integer_storage_and_block_scales_are_refused_by_name(tmp_path):
    state = to_original(WAN_ORIGINAL, _reference_state())
    state["blocks.0.self_attn.q.weight"] = torch.zeros(state["blocks.0.self_attn.q.weight"].shape, dtype=torch.int8)
    with pytest.raises(CheckpointError, match=r"int8\.safetensors: tensor 'blocks\.0\.self_attn\.q\.weight' is "
                                              r"stored as torch\.int8"):
        _load(save(state, tmp_path / "int8.safetensors"))
    fp8, _ = to_scaled_fp8(to_original(WAN_ORIGINAL, _reference_state()), "mixed")
    fp8["blocks.0.ffn.0.weight_scale"] = torch.ones(2, 2)
    with pytest.raises(CheckpointError, match=r"blocks\.0\.ffn\.0\.weight': its scale has shape \(2, 2\)"):
        _load(save(fp8, tmp_path / "blocks.safetensors"))


def test_another_familys_file_names_the_file_and_its_first_tensor(tmp_path):
    path = save({"double_blocks.0.img_attn.qkv.weight": torch.zeros(6, 2)}, tmp_path / "flux.safetensors")
    with pytest.raises(CheckpointError, match=r"flux\.safetensors: unexpected tensor 'double_blocks\.0\.img_attn"
                                              r"\.qkv\.weight' for WanTransformer .*diffusers layout"):
        _load(path)


def test_wrong_shapes_name_the_tensor_and_both_shapes(tmp_path):
    path = save(to_original(WAN_ORIGINAL, _reference_state(TINY_B)), tmp_path / "b.safetensors")
    with pytest.raises(CheckpointError, match=r"b\.safetensors: tensor '.*' has shape \(.*\), WanTransformer\..* "
                                              r"expects"):
        _load(path)


def test_a_missing_tensor_is_named(tmp_path):
    state = to_original(WAN_ORIGINAL, _reference_state())
    del state["blocks.1.ffn.2.weight"]
    with pytest.raises(CheckpointError, match=r"missing tensor 'blocks\.1\.ffn\.net\.2\.weight'.*Wan-AI original"):
        _load(save(state, tmp_path / "partial.safetensors"))


def test_a_truncated_file_is_a_checkpoint_error(tmp_path):
    path = save(to_original(WAN_ORIGINAL, _reference_state()), tmp_path / "t.safetensors")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"t\.safetensors: "):
        _load(path)


def test_row_ops_split_fused_tensors_and_swap_halves():
    qkv = torch.arange(12.0).reshape(6, 2)
    pairs = FLUX2_BFL.convert("model.diffusion_model.double_blocks.3.txt_attn.qkv.weight", lambda: qkv)
    assert [k for k, _ in pairs] == [f"transformer_blocks.3.attn.add_{p}_proj.weight" for p in "qkv"]
    torch.testing.assert_close(torch.cat([t for _, t in pairs]), qkv)
    ((key, swapped),) = FLUX2_BFL.convert("final_layer.adaLN_modulation.1.weight", lambda: qkv)
    assert key == "norm_out.linear.weight"
    torch.testing.assert_close(swapped, torch.cat([qkv[3:], qkv[:3]]))
    torch.testing.assert_close(swap_halves(swapped), qkv)
    uneven = KeyLayout("test layout", ("x",), splits=(RowSplit("a.qkv", ("a.q", "a.k", "a.v")),))
    with pytest.raises(CheckpointError, match=r"'a\.qkv\.weight' has 4 rows"):
        uneven.convert("a.qkv.weight", lambda: torch.zeros(4, 2))


def test_layout_prefix_rules_and_segments():
    layout = WAN_ORIGINAL
    assert layout.rename("blocks.2.self_attn.o.weight") == "blocks.2.attn1.to_out.0.weight"
    assert layout.rename("blocks.2.cross_attn.k_img.bias") == "blocks.2.attn2.add_k_proj.bias"
    assert layout.rename("head.modulation") == "scale_shift_table"


def test_overrides_are_checked_before_loading(tmp_path):
    file = save({"x": torch.zeros(1)}, tmp_path / "t.safetensors")
    assert component_files((("vae", str(file)),), ("transformer", "vae"), "ckpt") == {"vae": file}
    with pytest.raises(DeployError, match=r"reads no file for component 'text_encoder'; it takes one for: "
                                          r"transformer, vae"):
        component_files((("text_encoder", str(file)),), ("transformer", "vae"), "ckpt")
    with pytest.raises(CheckpointError, match=r"components \(--component transformer=\.\.\.\): .*gone\.safetensors "
                                              r"does not exist"):
        component_files((("transformer", str(tmp_path / "gone.safetensors")),), ("transformer",), "ckpt")
