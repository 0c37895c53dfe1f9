"""Flux2's memory estimate at the production config: what each part responds to (no weights needed)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import torch
from PIL import Image

from vidloom.core.deploy import DeployConfig
from vidloom.core.request import GenerationRequest, Task
from vidloom.families.flux2.transformer import Flux2TransformerConfig
from vidloom.families.flux2.vae import Flux2VAEConfig
from vidloom.families.flux2.memory import footprint, request_estimator


GEOMETRY = SimpleNamespace(spatial_multiple=16)  # Klein: 8x VAE, 2x2 patches


@dataclasses.dataclass
class _Instance:
    components: dict
    deploy: DeployConfig = DeployConfig()
    dtype: torch.dtype = torch.bfloat16
    device: torch.device = torch.device("cuda")
    card: object = dataclasses.field(default_factory=lambda: SimpleNamespace(geometry=GEOMETRY))

    def __getitem__(self, name):
        return self.components[name]


def _instance(distilled: bool = False, **deploy) -> _Instance:
    return _Instance({"transformer": SimpleNamespace(config=Flux2TransformerConfig()),
                      "vae": SimpleNamespace(config=Flux2VAEConfig()), "distilled": distilled}, DeployConfig(**deploy))


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
    assert request_estimator(_Instance({})) is None
