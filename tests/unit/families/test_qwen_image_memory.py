"""Qwen-Image's memory estimate at the production config: what each part responds to, and admission (no weights)."""

from __future__ import annotations

import pytest
from PIL import Image

from tests.helpers.config_instance import ConfigInstance, config_instance
from vidloom.core.errors import LimitExceeded
from vidloom.core.limits import RequestLimits
from vidloom.core.request import GenerationRequest, Task
from vidloom.models.wan.vae import WanVAEConfig
from vidloom.families.qwen_image.cards import DEFAULTS, MEMORY_ESTIMATOR, qwen_image_card
from vidloom.families.qwen_image.memory import footprint, request_estimator
from vidloom.families.qwen_image.transformer import QwenImageTransformerConfig

CARD = qwen_image_card("qwen-image", "test", multiple=16, defaults=DEFAULTS, description="test")


def _instance(**deploy) -> ConfigInstance:
    return config_instance(QwenImageTransformerConfig(), WanVAEConfig(), CARD, **deploy)


def _request(size: int = 1024, **fields) -> GenerationRequest:
    return GenerationRequest("a fox", task=Task.T2I, height=size, width=size, num_frames=1, **fields)


def test_the_card_names_the_estimator_and_it_grows_with_the_size():
    assert CARD.memory_estimator == MEMORY_ESTIMATOR
    estimate = request_estimator(_instance())
    assert estimate(_request(512)) < estimate(_request(1024)) < estimate(_request(2048))
    assert 1 << 30 < estimate(_request(1024)) < 24 << 30
    assert request_estimator(ConfigInstance({})) is None


def test_an_edit_reference_adds_its_tokens_but_no_decode_and_tiling_caps_the_decode():
    plain = footprint(_instance(), _request())
    edit = footprint(_instance(), _request(image=(Image.new("RGB", (64, 64)),)))
    assert edit.denoise > plain.denoise and edit.decode == plain.decode
    tiled = footprint(_instance(vae_tile=256), _request(2048))
    assert tiled.decode < footprint(_instance(), _request(2048)).decode


def test_zero_cond_t_s_per_token_modulations_count_for_an_edit_only():
    edit_2511 = config_instance(QwenImageTransformerConfig(zero_cond_t=True), WanVAEConfig(), CARD)
    edit = _request(image=(Image.new("RGB", (64, 64)),))
    assert footprint(edit_2511, edit).denoise > footprint(_instance(), edit).denoise
    assert footprint(edit_2511, _request()).denoise == footprint(_instance(), _request()).denoise


def test_a_small_memory_limit_refuses_a_big_image_naming_the_limit():
    estimate = request_estimator(_instance())
    limits = RequestLimits(max_memory_bytes=estimate(_request(1024)) + 1)
    limits.check(_request(1024), estimate)
    with pytest.raises(LimitExceeded) as info:
        limits.check(_request(2048), estimate)
    assert info.value.field == "width" and "max_request_memory" in str(info.value)
