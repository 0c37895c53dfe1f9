"""Parity: our HeliosTransformer against diffusers' HeliosTransformer3DModel on two tiny random configs, with the
history latents (long, mid, short with the first-frame prefix) and frame indices the pipeline passes."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from vidloom.families.helios.config import HELIOS_TRANSFORMER_NAME_MAP, HeliosTransformerConfig
from vidloom.families.helios.transformer import HeliosHistory, HeliosTransformer
from vidloom.layers.prompt_kv import PromptKV

diffusers = pytest.importorskip("diffusers")

# float32 on CPU, the same ops in the same order up to reshapes and the split of per-token modulation into
# history and chunk segments: only summation order can differ, far below 1e-5 at these sizes.
FP32_TOL = 1e-5

# Two configs that differ in what an implementation could get wrong: the key amplification (per head / scalar),
# zero-timestep history, cross-attention of history tokens, the cross norm, rope_dim split and head count.
CASES: dict[str, dict[str, Any]] = {
    "h2_amplify_per_head": dict(
        num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4, text_dim=24, freq_dim=16,
        ffn_dim=32, num_layers=2, rope_dim=(4, 4, 4), cross_attn_norm=True, guidance_cross_attn=True,
        zero_history_timestep=True, is_amplify_history=True, history_scale_mode="per_head"),
    "h3_scalar_no_guidance_ca": dict(
        num_attention_heads=3, attention_head_dim=16, in_channels=6, out_channels=6, text_dim=20, freq_dim=32,
        ffn_dim=40, num_layers=3, rope_dim=(6, 6, 4), cross_attn_norm=False, guidance_cross_attn=False,
        zero_history_timestep=False, is_amplify_history=True, history_scale_mode="scalar", rope_theta=500.0),
}
# (long, mid, short) history latent frames as the pipeline's history_sizes, then the chunk's latent frames.
HISTORY_SIZES = (16, 2, 1)
CHUNK_FRAMES = 3
HEIGHT, WIDTH = 6, 10  # latent; odd multiples of the patch so the mid/long paddings and pooling matter


def _reference(kwargs: dict[str, Any]) -> torch.nn.Module:
    torch.manual_seed(0)
    ref = diffusers.HeliosTransformer3DModel(**kwargs).eval()
    # Perturb everything (norm weights start at 1, biases at 0) by a normal offset: away from float32 denormals.
    with torch.no_grad():
        for param in ref.parameters():
            param.add_(0.1 * torch.randn_like(param))
    return ref


def _ours(ref: torch.nn.Module) -> HeliosTransformer:
    model = HeliosTransformer(HeliosTransformerConfig.from_diffusers(dict(ref.config))).eval()
    mapped = {HELIOS_TRANSFORMER_NAME_MAP.to_module(k): v for k, v in ref.state_dict().items()}
    model.load_state_dict(mapped, strict=True)
    return model


def _inputs(kwargs: dict[str, Any], history: bool) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(1)
    c = kwargs["in_channels"]
    long, mid, short = HISTORY_SIZES
    indices = torch.arange(1 + long + mid + short + CHUNK_FRAMES)
    prefix, i_long, i_mid, i_short, i_chunk = indices.split([1, long, mid, short, CHUNK_FRAMES])
    batch = 2
    out: dict[str, Any] = dict(
        hidden_states=torch.randn(batch, c, CHUNK_FRAMES, HEIGHT, WIDTH, generator=gen),
        timestep=torch.tensor([999.0, 437.25], dtype=torch.float64),
        encoder_hidden_states=torch.randn(batch, 7, kwargs["text_dim"], generator=gen),
        indices_hidden_states=i_chunk[None].expand(batch, -1),
    )
    if history:
        out.update(
            latents_history_long=torch.randn(batch, c, long, HEIGHT, WIDTH, generator=gen),
            latents_history_mid=torch.randn(batch, c, mid, HEIGHT, WIDTH, generator=gen),
            latents_history_short=torch.randn(batch, c, 1 + short, HEIGHT, WIDTH, generator=gen),
            indices_latents_history_long=i_long[None].expand(batch, -1),
            indices_latents_history_mid=i_mid[None].expand(batch, -1),
            indices_latents_history_short=torch.cat([prefix, i_short])[None].expand(batch, -1),
        )
    return out


def _our_call(model: HeliosTransformer, inputs: dict[str, Any]) -> torch.Tensor:
    history = None
    if "latents_history_short" in inputs:
        history = HeliosHistory(
            inputs["latents_history_short"], inputs["indices_latents_history_short"][0],
            inputs["latents_history_mid"], inputs["indices_latents_history_mid"][0],
            inputs["latents_history_long"], inputs["indices_latents_history_long"][0])
    return model(inputs["hidden_states"], inputs["timestep"], inputs["encoder_hidden_states"],
                 inputs["indices_hidden_states"][0], history)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("history", [True, False], ids=["history", "first_chunk_shape"])
def test_forward_matches_diffusers(case: str, history: bool) -> None:
    kwargs = CASES[case]
    ref = _reference(kwargs)
    ours = _ours(ref)
    inputs = _inputs(kwargs, history)
    with torch.no_grad():
        expected = ref(**inputs, return_dict=False)[0]
        got = _our_call(ours, inputs)
    assert got.shape == expected.shape
    diff = (got - expected).abs().max().item()
    assert diff <= FP32_TOL, f"max |diff| {diff:.3g}"
    assert expected.abs().max() > 0.1  # a live output, not a vanishing one


@pytest.mark.parametrize("case", list(CASES))
def test_name_map_is_a_bijection(case: str) -> None:
    ref = _reference(CASES[case])
    ours = HeliosTransformer(HeliosTransformerConfig.from_diffusers(dict(ref.config)))
    ref_keys = set(ref.state_dict())
    assert {HELIOS_TRANSFORMER_NAME_MAP.to_module(k) for k in ref_keys} == set(ours.state_dict())
    assert {HELIOS_TRANSFORMER_NAME_MAP.to_checkpoint(k) for k in ours.state_dict()} == ref_keys


def test_config_round_trips_every_key() -> None:
    from vidloom.families.helios.config import CONFIG_KEYS

    config = HeliosTransformerConfig.from_diffusers(dict(_reference(CASES["h3_scalar_no_guidance_ca"]).config))
    written = config.to_diffusers()
    assert set(written) - {"_class_name"} == CONFIG_KEYS
    assert HeliosTransformerConfig.from_diffusers(written) == config


@pytest.mark.parametrize("real", [(5, 12), (64, 3)], ids=["padded", "one-unpadded"])
def test_collapsed_prompt_padding_matches_diffusers(real: tuple[int, int]) -> None:
    """The pipeline's zero-padded prompts (64 rows here, 512 there) prepared with their padding keys collapsed
    (layers.prompt_kv) against diffusers attending to every row: within FP32_TOL."""
    kwargs = CASES["h2_amplify_per_head"]
    ref = _reference(kwargs)
    ours = _ours(ref)
    inputs = _inputs(kwargs, history=True)
    text = torch.zeros(2, 64, kwargs["text_dim"])
    for row, tokens in enumerate(real):
        text[row, :tokens] = torch.randn(tokens, kwargs["text_dim"], generator=torch.Generator().manual_seed(row))
    inputs["encoder_hidden_states"] = text
    with torch.no_grad():
        expected = ref(**inputs, return_dict=False)[0]
        prepared = PromptKV.stack([ours.prepare_prompt(text[:1]), ours.prepare_prompt(text[1:])])
        assert prepared.bias is not None and prepared.keys[0].shape[1] < 64 or real[0] == 64
        got = _our_call(ours, {**inputs, "encoder_hidden_states": prepared})
    diff = (got - expected).abs().max().item()
    assert diff <= FP32_TOL, f"max |diff| {diff:.3g}"
