"""HunyuanVideo-1.5's memory estimate at the production config: what each part responds to, and admission."""

from __future__ import annotations

import pytest
from PIL import Image

from tests.helpers.config_instance import ConfigInstance, config_instance
from vidloom.core.errors import LimitExceeded
from vidloom.core.limits import RequestLimits
from vidloom.core.request import GenerationRequest, Task
from vidloom.families.hunyuan15.cards import CARDS, MEMORY_ESTIMATOR
from vidloom.families.hunyuan15.memory import footprint, request_estimator
from vidloom.families.hunyuan15.transformer import Hunyuan15TransformerConfig
from vidloom.families.hunyuan15.vae import Hunyuan15VAEConfig


def _instance(**deploy) -> ConfigInstance:
    return config_instance(Hunyuan15TransformerConfig(), Hunyuan15VAEConfig(), None, **deploy)


def _request(height: int = 480, width: int = 848, frames: int = 121, **fields) -> GenerationRequest:
    return GenerationRequest("a fox", task=Task.T2V, height=height, width=width, num_frames=frames, **fields)


def test_the_cards_name_the_estimator_and_it_grows_with_size_and_frames():
    assert CARDS.memory_estimator == MEMORY_ESTIMATOR
    estimate = request_estimator(_instance())
    assert estimate(_request(frames=33)) < estimate(_request()) < estimate(_request(frames=241))
    assert estimate(_request()) < estimate(_request(720, 1280))
    assert request_estimator(ConfigInstance({})) is None


def test_the_first_frame_adds_siglip_tokens_and_tiling_caps_the_decode():
    plain = footprint(_instance(), _request())
    i2v = footprint(_instance(), _request(image=(Image.new("RGB", (64, 64)),)))
    assert i2v.denoise > plain.denoise and i2v.decode == plain.decode
    assert footprint(_instance(vae_tile=256), _request()).decode < plain.decode


def test_a_small_memory_limit_refuses_a_long_clip_naming_the_limit():
    estimate = request_estimator(_instance())
    limits = RequestLimits(max_memory_bytes=estimate(_request(frames=1)) + 1)
    with pytest.raises(LimitExceeded) as info:
        limits.check(_request(), estimate)
    assert info.value.field == "num_frames" and "max_request_memory" in str(info.value)
