"""Parity: our WanTransformer against diffusers' WanTransformer3DModel on tiny random configs."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.helpers.mixed_precision import cast_mixed, fp32_islands
from vidloom.models.wan.transformer import WanTransformer
from vidloom.models.wan.transformer_config import WAN_TRANSFORMER_NAME_MAP, WanTransformerConfig

diffusers = pytest.importorskip("diffusers")

# fp32 on CPU, same ops in the same order up to reshapes and attention layout:
# only summation-order reordering differs, which stays well below 1e-5 at these sizes.
FP32_TOL = 1e-5

# (diffusers kwargs, latent (F, H, W), text length)
CASES: dict[str, tuple[dict[str, Any], tuple[int, int, int], int]] = {
    "h2_d12_l2": (
        dict(
            patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4,
            out_channels=4, text_dim=24, freq_dim=16, ffn_dim=32, num_layers=2, cross_attn_norm=True,
        ),
        (3, 4, 6),
        7,
    ),
    "h3_d16_l3_nocrossnorm": (
        dict(
            patch_size=(1, 2, 2), num_attention_heads=3, attention_head_dim=16, in_channels=16,
            out_channels=8, text_dim=20, freq_dim=32, ffn_dim=40, num_layers=3, cross_attn_norm=False,
        ),
        (5, 6, 4),
        5,
    ),
    "h2_d20_l1_patch212": (
        dict(
            patch_size=(2, 1, 2), num_attention_heads=2, attention_head_dim=20, in_channels=4,
            out_channels=4, text_dim=16, freq_dim=15, ffn_dim=24, num_layers=1, cross_attn_norm=True,
        ),
        (4, 3, 4),
        6,
    ),
}


def _reference(kwargs: dict[str, Any]) -> torch.nn.Module:
    torch.manual_seed(0)
    ref = diffusers.WanTransformer3DModel(**kwargs).eval()
    # Default init leaves norm weights at 1 and biases at 0; perturb everything so a
    # swapped or dropped parameter cannot hide behind a trivial value.
    with torch.no_grad():
        for param in ref.parameters():
            param.add_(0.1 * torch.randn_like(param))
    return ref


def _ours(ref: torch.nn.Module) -> WanTransformer:
    model = WanTransformer(WanTransformerConfig.from_diffusers(ref.config)).eval()
    mapped = {WAN_TRANSFORMER_NAME_MAP.to_module(k): v for k, v in ref.state_dict().items()}
    model.load_state_dict(mapped, strict=True)
    return model


def _inputs(kwargs: dict[str, Any], fhw: tuple[int, int, int], text_len: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(1)
    latents = torch.randn(2, kwargs["in_channels"], *fhw, generator=gen)
    timestep = torch.tensor([999.0, 437.25])
    text = torch.randn(2, text_len, kwargs["text_dim"], generator=gen)
    return latents, timestep, text


@pytest.mark.parametrize("case", list(CASES))
def test_name_map_is_a_bijection(case: str) -> None:
    kwargs, _, _ = CASES[case]
    ref = _reference(kwargs)
    ours = WanTransformer(WanTransformerConfig.from_diffusers(ref.config))
    ref_keys = list(ref.state_dict())
    our_keys = set(ours.state_dict())
    mapped = [WAN_TRANSFORMER_NAME_MAP.to_module(k) for k in ref_keys]
    assert len(set(mapped)) == len(ref_keys), "two checkpoint keys map to one module key"
    assert set(mapped) == our_keys
    for key in ref_keys:
        assert WAN_TRANSFORMER_NAME_MAP.to_checkpoint(WAN_TRANSFORMER_NAME_MAP.to_module(key)) == key
    for key in our_keys:
        assert WAN_TRANSFORMER_NAME_MAP.to_module(WAN_TRANSFORMER_NAME_MAP.to_checkpoint(key)) == key
    # Shapes agree too, so strict loading is not just a name match.
    ref_sd = ref.state_dict()
    our_sd = ours.state_dict()
    for key in ref_keys:
        assert ref_sd[key].shape == our_sd[WAN_TRANSFORMER_NAME_MAP.to_module(key)].shape, key


@pytest.mark.parametrize("case", list(CASES))
def test_forward_matches_diffusers_fp32(case: str) -> None:
    kwargs, fhw, text_len = CASES[case]
    ref = _reference(kwargs)
    ours = _ours(ref)
    latents, timestep, text = _inputs(kwargs, fhw, text_len)
    with torch.no_grad():
        expected = ref(latents, timestep, text, return_dict=False)[0]
        got = ours(latents, timestep, text)
    assert got.shape == expected.shape == (2, kwargs["out_channels"], *fhw)
    assert expected.abs().max() > 0.1  # the comparison is not between near-zero tensors
    diff = (got - expected).abs().max().item()
    assert diff <= FP32_TOL, f"{case}: max abs diff {diff:.3e}"


def test_keep_fp32_matches_diffusers() -> None:
    kwargs, _, _ = CASES["h2_d12_l2"]
    ref = _reference(kwargs)
    ours = _ours(ref)
    ref_fp32 = fp32_islands(ref, ref._keep_in_fp32_modules)
    assert {WAN_TRANSFORMER_NAME_MAP.to_module(k) for k in ref_fp32} == fp32_islands(ours, WanTransformer.KEEP_FP32)


@pytest.mark.parametrize("case", list(CASES))
def test_forward_matches_diffusers_bf16(case: str) -> None:
    # Both models in bf16 with their float32 parameters kept as diffusers'
    # from_pretrained(torch_dtype=bf16) keeps them. Same CPU kernels on the same dtypes
    # give bitwise-equal results; an fp32 island placed differently shows up as 1-2 ulp.
    kwargs, fhw, text_len = CASES[case]
    ref = _reference(kwargs)
    ours = _ours(ref)
    cast_mixed(ref, ref._keep_in_fp32_modules)
    cast_mixed(ours, WanTransformer.KEEP_FP32)
    latents, timestep, text = _inputs(kwargs, fhw, text_len)
    with torch.no_grad():
        expected = ref(latents.bfloat16(), timestep, text.bfloat16(), return_dict=False)[0]
        got = ours(latents.bfloat16(), timestep, text.bfloat16())
    assert got.dtype == expected.dtype == torch.bfloat16
    diff = (got.float() - expected.float()).abs().max().item()
    assert diff == 0.0, f"{case}: bf16 max abs diff {diff:.3e}"


def test_config_round_trips_through_diffusers() -> None:
    for kwargs, _, _ in CASES.values():
        ref = _reference(kwargs)
        config = WanTransformerConfig.from_diffusers(ref.config)
        exported = config.to_diffusers()
        assert exported["_class_name"] == "WanTransformer3DModel"
        assert WanTransformerConfig.from_diffusers(exported) == config
        public = {k: v for k, v in ref.config.items() if not k.startswith("_")}
        assert {k: v for k, v in exported.items() if not k.startswith("_")} == {
            k: list(v) if k == "patch_size" else v for k, v in public.items()
        }
        rebuilt = diffusers.WanTransformer3DModel.from_config(exported)
        assert WanTransformerConfig.from_diffusers(dict(rebuilt.config)) == config
