"""RequestLimits and the boundary checks every request meets: each refusal names the field and the limit."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import pytest
import torch

from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import InvalidRequest, LimitExceeded
from vidloom.core.limits import RequestLimits
from vidloom.core.request import GenerationRequest
from vidloom.media.request_inputs import resolve_request
from vidloom.models.wan.transformer_config import WanTransformerConfig
from vidloom.models.wan.vae import WanVAEConfig
from vidloom.families.wan.cards import wan21_t2v_1_3b
from vidloom.families.wan.demo import demo_card
from vidloom.families.wan.memory import estimate_request_bytes, request_estimator


@pytest.fixture(scope="module")
def card():
    return demo_card()  # 192x128, 17 frames, 8 steps by default; 512 text tokens


def test_defaults_derive_from_the_card():
    wan = wan21_t2v_1_3b()  # 832x480, 81 frames, 50 steps
    limits = RequestLimits.from_card(wan)
    assert limits.max_pixels == 4 * 832 * 480
    assert limits.max_frames == 4 * (4 * 21 - 1) + 1  # 4x the latent frames, still 4k+1
    assert limits.max_steps == 1000
    assert limits.max_prompt_chars == 16 * 512
    assert limits.max_memory_bytes is None


@pytest.mark.parametrize(("changes", "field", "limit"), [
    ({"height": 2048, "width": 2048}, "width", "max_pixels"),
    ({"num_frames": 1025}, "num_frames", "max_frames"),
    ({"num_inference_steps": 1_000_000}, "num_inference_steps", "max_steps"),
])
def test_each_limit_names_field_and_setting(card, changes, field, limit):
    request = resolve_request(GenerationRequest(prompt="a cat", **changes), card)
    with pytest.raises(LimitExceeded) as info:
        RequestLimits.from_card(card).check(request)
    assert info.value.field == field and info.value.limit == limit and limit in str(info.value)


def test_limits_allow_the_card_defaults(card):
    RequestLimits.from_card(card, max_memory_bytes=1 << 40).check(resolve_request(GenerationRequest("a cat"), card),
                                                                 lambda r: 1 << 30)


def test_overrides_replace_only_given_fields(card):
    limits = RequestLimits.from_card(card).with_overrides(max_steps=5, max_frames=None)
    assert limits.max_steps == 5 and limits.max_frames == RequestLimits.from_card(card).max_frames
    with pytest.raises(ValueError, match="max_steps"):
        RequestLimits(max_steps=0)


def _fake_instance(card, dtype=torch.bfloat16, **deploy):
    """The estimator reads only configs, dtype and deploy options: no weights needed."""
    components = {"transformer": SimpleNamespace(config=WanTransformerConfig(num_attention_heads=12, ffn_dim=8960,
                                                                             num_layers=30)),
                  "vae": SimpleNamespace(config=WanVAEConfig())}
    return _Instance(card, components, dtype, DeployConfig(**deploy))


@dataclasses.dataclass
class _Instance:
    card: object
    components: dict
    dtype: torch.dtype
    deploy: DeployConfig
    device: torch.device = torch.device("cpu")

    def __getitem__(self, name):
        return self.components[name]


def test_memory_estimate_grows_with_the_work_and_refuses_oversized():
    wan = wan21_t2v_1_3b()
    estimate = request_estimator(_fake_instance(wan))
    base = resolve_request(GenerationRequest("a cat", seed=1), wan)
    big = dataclasses.replace(base, height=2048, width=2048, num_frames=1)
    long = dataclasses.replace(base, num_frames=1025)
    assert estimate(big) > estimate(dataclasses.replace(big, height=1024, width=1024)) > 0
    assert estimate(long) > estimate(base)
    limits = RequestLimits(max_memory_bytes=3 << 30)  # the 3 GiB box
    with pytest.raises(LimitExceeded) as info:
        limits.check(big, estimate)
    assert info.value.field == "width" and "max_request_memory" in str(info.value)
    with pytest.raises(LimitExceeded) as info:
        RequestLimits(max_memory_bytes=estimate(dataclasses.replace(long, num_frames=1)) + 1).check(long, estimate)
    assert info.value.field == "num_frames"  # one frame fits, so the frame count is to blame


def test_vae_tiling_lowers_the_estimate():
    wan = wan21_t2v_1_3b()
    request = resolve_request(GenerationRequest("a cat", height=1280, width=1280, num_frames=81, seed=1), wan)
    plain = estimate_request_bytes(_fake_instance(wan), request)
    tiled = estimate_request_bytes(_fake_instance(wan, vae_tile=256), request)
    assert tiled < plain


def test_per_token_timesteps_raise_the_estimate():
    from vidloom.families.wan.conditioning import WanPipelineConfig

    wan = wan21_t2v_1_3b()
    request = resolve_request(GenerationRequest("a cat", seed=1), wan)
    plain = _fake_instance(wan, vae_tile=128)  # tiles keep the decode term below the denoise term
    per_token = _fake_instance(wan, vae_tile=128)
    per_token.components["wan_pipeline"] = WanPipelineConfig(expand_timesteps=True)
    assert estimate_request_bytes(per_token, request) > estimate_request_bytes(plain, request)


def test_estimator_is_none_without_a_wan_model(card):
    assert request_estimator(_Instance(card, {}, torch.float32, DeployConfig())) is None


# -- hard bounds in core validation (every path: Python API, CLI, server) ----------------------

BAD = [
    ("seed", 2**64), ("seed", -1),
    ("fps", 2**31), ("fps", 1_000_000_000),
    ("flow_shift", math.nan), ("flow_shift", math.inf), ("flow_shift", 0.0), ("flow_shift", -1.0),
    ("guidance_scale", math.nan), ("guidance_scale", math.inf), ("guidance_scale", 1e308), ("guidance_scale", -1.0),
    ("step_cache_threshold", math.nan),
    ("prompt", "\ud800"), ("prompt", "ok \udfff"), ("negative_prompt", "\udfff"),
    ("prompt", "x" * (16 * 512 + 1)),
]


@pytest.mark.parametrize(("field", "value"), BAD, ids=[f"{f}={v!r}"[:30] for f, v in BAD])
def test_out_of_range_values_fail_validation_naming_the_field(card, field, value):
    request = dataclasses.replace(GenerationRequest("a cat"), **{field: value})
    with pytest.raises(InvalidRequest) as info:
        resolve_request(request, card)
    assert info.value.field == field


def test_largest_valid_seed_is_accepted(card):
    assert resolve_request(GenerationRequest("a cat", seed=2**64 - 1), card).seed == 2**64 - 1
