"""Helios' memory estimate at the production config: a chunk's working set, the held video, and admission."""

from __future__ import annotations

import pytest

from tests.helpers.config_instance import ConfigInstance, config_instance
from vidloom.core.errors import LimitExceeded
from vidloom.core.limits import RequestLimits
from vidloom.core.request import GenerationRequest, Task
from vidloom.models.wan.vae import WanVAEConfig
from vidloom.families.helios.cards import CARDS, MEMORY_ESTIMATOR
from vidloom.families.helios.config import HeliosTransformerConfig
from vidloom.families.helios.memory import footprint, request_estimator
from vidloom.layers.prompt_kv import prompt_kv_bytes
from vidloom.models.wan.text import WAN_TEXT_TOKENS


def _instance(**deploy) -> ConfigInstance:
    return config_instance(HeliosTransformerConfig(), WanVAEConfig(), None, **deploy)


def _request(height: int = 384, width: int = 640, frames: int = 129, **fields) -> GenerationRequest:
    return GenerationRequest("a fox", task=Task.T2V, height=height, width=width, num_frames=frames, **fields)


def test_chunks_keep_the_working_set_and_only_the_held_video_grows_with_frames():
    assert CARDS.memory_estimator == MEMORY_ESTIMATOR
    short, long = footprint(_instance(), _request(frames=33)), footprint(_instance(), _request(frames=1057))
    assert (short.denoise, short.decode) == (long.denoise, long.decode)  # one chunk (and its history) at a time
    assert long.persistent > short.persistent
    estimate = request_estimator(_instance())
    assert estimate(_request()) < estimate(_request(720, 1280))
    assert request_estimator(ConfigInstance({})) is None


def test_batched_cfg_doubles_the_block_term():
    """Batched CFG doubles the blocks' working set and adds the step's stacked copy of both branches' prompt K/V."""
    sequential = footprint(_instance(), _request(guidance_scale=5.0, negative_prompt="blur"))
    batched = footprint(_instance(cfg_mode="batched"), _request(guidance_scale=5.0, negative_prompt="blur"))
    dit = HeliosTransformerConfig()
    prompt = prompt_kv_bytes(dit.num_layers, WAN_TEXT_TOKENS, dit.num_attention_heads * dit.attention_head_dim, 2)
    assert batched.denoise == 2 * sequential.denoise + 2 * prompt
    assert batched.persistent == sequential.persistent  # both branches' K/V are kept either way


def test_a_small_memory_limit_refuses_a_big_frame_naming_the_limit():
    estimate = request_estimator(_instance())
    limits = RequestLimits(max_memory_bytes=estimate(_request()) + 1)
    limits.check(_request(), estimate)
    with pytest.raises(LimitExceeded) as info:
        limits.check(_request(720, 1280), estimate)
    assert info.value.field == "width" and "max_request_memory" in str(info.value)


def test_vae_tile_bounds_the_decode_term_by_one_tile():
    """Each chunk decodes tile by tile under vae_tile: the decode term follows the tile's pixels, the rest stays."""
    whole, tiled = footprint(_instance(), _request()), footprint(_instance(vae_tile=256), _request())
    assert tiled.decode * 384 * 640 == whole.decode * 256 * 256
    assert (tiled.denoise, tiled.persistent) == (whole.denoise, whole.persistent)
    covering = footprint(_instance(vae_tile=1024), _request())  # a tile larger than the frame: the frame's pixels
    assert covering.decode == whole.decode
