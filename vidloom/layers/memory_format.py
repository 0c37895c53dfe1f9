"""Channels-last layout for convolutional decoders: weights stored NHWC / NDHWC so convs never reorder them."""

from __future__ import annotations

import torch
from torch import Tensor, nn


def use_channels_last(module: nn.Module) -> nn.Module:
    """Store every Conv2d / Conv3d weight of `module` channels-last, in place; returns `module`.

    oneDNN's (and cuDNN's) fastest convolutions take channels-last operands. With the weights stored so,
    a conv's output is channels-last too, and the norms, activations and concatenations between convs keep
    that layout, so no conv reorders its input or its weight on every call. Loading weights afterwards
    (`copy_` into these tensors) and casting (`.to(dtype)`) keep the layout.
    """
    for layer in module.modules():
        if isinstance(layer, nn.Conv3d):
            layer.weight.data = layer.weight.data.contiguous(memory_format=torch.channels_last_3d)
        elif isinstance(layer, nn.Conv2d):
            layer.weight.data = layer.weight.data.contiguous(memory_format=torch.channels_last)
    return module


def channels_last(x: Tensor) -> Tensor:
    """A 4D image batch or 5D video batch laid out channels-last (a no-op when it already is)."""
    return x.contiguous(memory_format=torch.channels_last_3d if x.ndim == 5 else torch.channels_last)
