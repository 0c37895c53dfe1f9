"""Tiny HeliosPipeline folders written by diffusers + transformers (random weights, offline tokenizer): the reference
side of the Helios parity tests, two configs that differ in what an implementation could get wrong."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tests.helpers.wan_checkpoints import TinyWan, reference_parts, wan_vae


@dataclass(frozen=True)
class TinyHelios:
    name: str
    transformer: dict[str, Any]
    vae: dict[str, Any]
    scheduler: dict[str, Any]


def helios_dit(heads: int, head_dim: int, channels: int, rope_dim: tuple[int, int, int], **switches: Any) -> dict:
    """HeliosTransformer3DModel keyword arguments at a tiny width (text_dim matches the tiny UMT5)."""
    return dict(patch_size=(1, 2, 2), num_attention_heads=heads, attention_head_dim=head_dim, in_channels=channels,
                out_channels=channels, text_dim=32, freq_dim=16, ffn_dim=32, num_layers=2, rope_dim=rope_dim,
                **switches)


TINY_A = TinyHelios(
    name="unipc-dynamic-shift",
    transformer=helios_dit(2, 12, 4, (4, 4, 4), is_amplify_history=True, history_scale_mode="per_head"),
    vae=wan_vae(base_dim=8, z_dim=4, dim_mult=[1, 2, 2, 2], num_res_blocks=1),
    scheduler=dict(stages=1, scheduler_type="unipc", use_dynamic_shifting=True, time_shift_type="exponential"),
)
TINY_B = TinyHelios(
    name="euler-no-shift",
    transformer=helios_dit(3, 16, 8, (6, 6, 4), cross_attn_norm=False, guidance_cross_attn=False,
                           zero_history_timestep=False, is_amplify_history=True, history_scale_mode="scalar"),
    vae=wan_vae(base_dim=8, z_dim=8, dim_mult=[1, 2, 4, 4], num_res_blocks=2),
    # The static shift, which the base pipeline never applies (it passes its own sigmas).
    scheduler=dict(stages=1, scheduler_type="euler", use_dynamic_shifting=False, shift=3.0),
)
CONFIGS = (TINY_A, TINY_B)


def reference_transformer(kwargs: dict[str, Any], seed: int) -> torch.nn.Module:
    """diffusers' HeliosTransformer3DModel, every parameter moved by N(0, 0.05) so no path is trivially zero."""
    from diffusers import HeliosTransformer3DModel

    torch.manual_seed(seed)
    model = HeliosTransformer3DModel(**kwargs).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return model


def write_tiny_helios(folder: Path, spec: TinyHelios, seed: int = 0) -> Path:
    """Save a HeliosPipeline folder for `spec` with diffusers' own save_pretrained."""
    from diffusers import HeliosPipeline, HeliosScheduler

    transformer = reference_transformer(spec.transformer, seed)
    parts = reference_parts(TinyWan(spec.name, spec.transformer, spec.vae), seed, vae_seed=seed + 1,
                            text_seed=seed + 2)
    pipe = HeliosPipeline(**parts, transformer=transformer, scheduler=HeliosScheduler(**spec.scheduler))
    pipe.save_pretrained(str(folder))
    return folder


@dataclass(frozen=True)
class TinyHeliosPyramid:
    base: TinyHelios  # transformer and VAE; its scheduler is replaced by `scheduler`
    scheduler: dict[str, Any]
    zero_star: bool
    # height, width: multiples of 16 * 2^(stages - 1). DISTILLED_A runs at the 3-stage minimum, 64x64 (a 1x1 token
    # grid at stage 1; the frames cost mostly the VAE, per pixel); PYRAMID_A cannot: the pipeline's CFG-Zero*
    # calls .view on a 1x1 grid's non-contiguous noise prediction and raises, so it keeps 64x128.
    size: tuple[int, int]
    distilled: bool = False  # is_distilled, with a HeliosDMDScheduler of `scheduler`'s keys
    amplify: bool = False  # the distilled test's is_amplify_first_chunk

    @property
    def name(self) -> str:
        return f"{'distilled' if self.distilled else 'pyramid'}-{self.base.name}"


PYRAMID_A = TinyHeliosPyramid(  # the published shape: 3 stages, gamma 1/3 (singular in float32), CFG-Zero*
    TINY_A, dict(stages=3, scheduler_type="unipc", use_dynamic_shifting=True, time_shift_type="exponential",
                 gamma=1 / 3), zero_star=True, size=(64, 128))
PYRAMID_B = TinyHeliosPyramid(  # 2 stages over a shifted train range, another gamma, Euler, plain CFG
    TINY_B, dict(stages=2, stage_range=[0, 0.5, 1], scheduler_type="euler", use_dynamic_shifting=False, shift=3.0,
                 gamma=0.25), zero_star=False, size=(32, 64))
PYRAMID_CONFIGS = (PYRAMID_A, PYRAMID_B)
DISTILLED_A = TinyHeliosPyramid(  # Helios-Distilled's shape: 3 stages, gamma 1/3, dynamic linear shift, amplified
    TINY_A, dict(stages=3, use_dynamic_shifting=True, time_shift_type="linear", gamma=1 / 3), zero_star=False,
    size=(64, 64), distilled=True, amplify=True)
DISTILLED_B = TinyHeliosPyramid(  # 2 stages over a shifted train range, exponential kind unused, not amplified
    TINY_B, dict(stages=2, stage_range=[0, 0.5, 1], use_dynamic_shifting=False, shift=3.0, gamma=0.25,
                 time_shift_type="exponential"), zero_star=False, size=(32, 64), distilled=True)
DISTILLED_CONFIGS = (DISTILLED_A, DISTILLED_B)


def write_tiny_helios_pyramid(folder: Path, spec: TinyHeliosPyramid, seed: int = 0) -> Path:
    """Save a HeliosPyramidPipeline folder for `spec` with diffusers' own save_pretrained."""
    from diffusers import HeliosDMDScheduler, HeliosPyramidPipeline, HeliosScheduler

    base = spec.base
    transformer = reference_transformer(base.transformer, seed)
    parts = reference_parts(TinyWan(base.name, base.transformer, base.vae), seed, vae_seed=seed + 1,
                            text_seed=seed + 2)
    scheduler = (HeliosDMDScheduler if spec.distilled else HeliosScheduler)(**spec.scheduler)
    pipe = HeliosPyramidPipeline(**parts, transformer=transformer, scheduler=scheduler,
                                 is_cfg_zero_star=spec.zero_star, is_distilled=spec.distilled)
    pipe.save_pretrained(str(folder))
    return folder


def pyramid_pair(spec: TinyHeliosPyramid, folder: Path) -> tuple[TinyHeliosPyramid, Any, Any]:
    """`spec` written to `folder`, then (spec, diffusers' HeliosPyramidPipeline, vidloom's native generator)."""
    from diffusers import HeliosPyramidPipeline

    from tests.helpers.reference_pipelines import reference_pipeline
    from vidloom.generator import VideoGenerator

    write_tiny_helios_pyramid(folder, spec)
    gen = VideoGenerator.from_pretrained(folder, device="cpu")
    assert gen.card.family == "helios"  # native, not the adapter running the reference itself
    return spec, reference_pipeline(HeliosPyramidPipeline, folder), gen


def float64_block_factor(monkeypatch: Any, pipe: Any) -> None:
    """The pyramid oracle's one patch. The pipeline factors the block covariance (1 + g) I - g 11^T + 1e-8 I after
    casting it to float32, where the 1e-8 is below the resolution at 1 + g: at g = 1/3 (2x2 patches, the published
    value) the float32 matrix has an eigenvalue of about -2e-8 and CPU Cholesky raises (a float64 factorization of
    the cast matrix fails too). Here the same formula is factored in float64 (positive definite by its 1e-8) and
    the factor cast to float32, as vidloom does; no other value changes."""
    factor = torch.linalg.cholesky
    gamma = pipe.scheduler.config.gamma

    def cholesky(cov: torch.Tensor) -> torch.Tensor:
        n = cov.shape[0]
        exact = (torch.eye(n, dtype=torch.float64) * (1 + gamma) - torch.ones(n, n, dtype=torch.float64) * gamma
                 + torch.eye(n, dtype=torch.float64) * 1e-8)
        assert torch.equal(exact.float(), cov)  # the matrix the pipeline built, before its float32 cast
        return factor(exact).float()

    monkeypatch.setattr(torch.linalg, "cholesky", cholesky)
