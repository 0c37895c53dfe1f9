"""The seeding rule every family shares with diffusers, so a seed gives the same video in both."""

from __future__ import annotations

import torch


def initial_noise(shape: tuple[int, ...], seed: int) -> tuple[torch.Tensor, torch.Generator]:
    """Float32 standard normal of `shape` on the CPU, and the generator it came from, seeded with `seed`.

    Drawn on the CPU whatever the device (diffusers' pipelines do the same when given a CPU
    generator), so the noise does not depend on the accelerator. The generator is returned
    so a stochastic sampler (DMD's re-noising) can continue the same stream.
    """
    generator = torch.Generator("cpu").manual_seed(seed)
    return torch.randn(shape, generator=generator, dtype=torch.float32), generator
