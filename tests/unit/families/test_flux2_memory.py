"""Flux2's memory estimate at the production config: what each part responds to (no weights needed)."""

from __future__ import annotations

from types import SimpleNamespace

from PIL import Image

from tests.helpers.config_instance import ConfigInstance, config_instance
from vidloom.core.request import GenerationRequest, Task
from vidloom.families.flux2.transformer import Flux2TransformerConfig
from vidloom.families.flux2.vae import Flux2VAEConfig
from vidloom.families.flux2.memory import footprint, request_estimator


GEOMETRY = SimpleNamespace(spatial_multiple=16)  # Klein: 8x VAE, 2x2 patches


def _instance(distilled: bool = False, **deploy) -> ConfigInstance:
    instance = config_instance(Flux2TransformerConfig(), Flux2VAEConfig(), SimpleNamespace(geometry=GEOMETRY), **deploy)
    instance.components["distilled"] = distilled
    return instance


def _request(**fields) -> GenerationRequest:
    return GenerationRequest("a fox", task=Task.T2I, height=1024, width=1024, num_frames=1, **fields)


def test_reference_images_add_their_tokens_up_to_one_megapixel_each():
    instance = _instance()
    plain = footprint(instance, _request(guidance_scale=1.0))
    small = footprint(instance, _request(guidance_scale=1.0, image=(Image.new("RGB", (512, 512)),)))
    huge = footprint(instance, _request(guidance_scale=1.0, image=(Image.new("RGB", (4096, 4096)),)))
    one_mp = footprint(instance, _request(guidance_scale=1.0, image=(Image.new("RGB", (1024, 1024)),)))
    assert plain.denoise < small.denoise < huge.denoise
    assert huge == one_mp  # the pipeline shrinks a reference to 1 MP first
    assert plain.decode == huge.decode  # references are encoded, never decoded


def test_batched_cfg_doubles_the_denoise_term_unless_distilled():
    sequential = footprint(_instance(), _request(guidance_scale=4.0))
    batched = footprint(_instance(cfg_mode="batched"), _request(guidance_scale=4.0))
    distilled = footprint(_instance(distilled=True, cfg_mode="batched"), _request(guidance_scale=4.0))
    assert batched.denoise == 2 * sequential.denoise
    assert distilled.denoise == sequential.denoise  # step-distilled Klein ignores guidance


def test_the_default_request_fits_the_gpu_it_is_made_for():
    estimate = request_estimator(_instance())
    assert estimate is not None
    assert 1 << 30 < estimate(_request(guidance_scale=4.0)) < 24 << 30  # Klein: 1024x1024 on a 24 GB card
    assert request_estimator(ConfigInstance({})) is None
