"""Shaping a reference's random weights so that a broken path shows in the output."""

from __future__ import annotations

import torch


def scale_params(module: torch.nn.Module, names: tuple[str, ...], factor: float) -> None:
    """Multiply every parameter whose name holds one of `names` by `factor`.

    Random init barely lets the output depend on the text, the timestep or the camera; louder conditioning
    makes a broken conditioning path move the output by many uint8 levels."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if any(n in name for n in names):
                p.mul_(factor)
