"""Single-file checkpoints for the component-override tests: a component's weights written in diffusers layout,
in an original layout (our KeyLayout table run backwards), or as ComfyUI-style FP8 with per-tensor scales.

The original-layout writer inverts our own table, so it proves nothing alone; the parity tests load the file it
writes with diffusers' `from_single_file` too, whose converter is the independent reference.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from safetensors.torch import save_file

from vidloom.loading.key_layout import KeyLayout, cat_rows, swap_halves
from vidloom.loading.name_map import NameMap


def random_state(module: torch.nn.Module, seed: int, scale: float = 0.05) -> dict[str, torch.Tensor]:
    """`module`'s state with every floating tensor moved by seeded noise: weights a loader must read from the file
    (the folder holds the unmoved ones), small enough to keep activations in range."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for key, tensor in module.state_dict().items():
        t = tensor.detach().float().clone()
        out[key] = t + torch.randn(t.shape, generator=g) * scale if t.is_floating_point() else t
    return out


def to_original(layout: KeyLayout, state: dict[str, torch.Tensor], prefix: str = "") -> dict[str, torch.Tensor]:
    """Diffusers-layout `state` in `layout`'s original keys: fused tensors concatenated, halves swapped back."""
    out: dict[str, torch.Tensor] = {}
    consumed: set[str] = set()
    for split in layout.splits:
        for key in list(state):
            fused = NameMap(((split.parts[0], split.fused),)).to_module(key)
            if fused == key:
                continue
            parts = [NameMap(((split.parts[0], p),)).to_module(key) for p in split.parts]
            out[fused] = cat_rows([state[p] for p in parts])
            consumed.update(parts)
    for key, tensor in state.items():
        if key in consumed:
            continue
        inner = layout.renames.to_checkpoint(_segments_back(layout, key))
        if any(inner == s or inner.startswith(s + ".") for s in layout.swapped):
            tensor = swap_halves(tensor)
        out[inner] = tensor
    return {prefix + key: value.contiguous() for key, value in out.items()}


def _segments_back(layout: KeyLayout, key: str) -> str:
    for original, renamed in layout.segments:
        key = re.sub(rf"(?<![^.]){re.escape(renamed)}(?![^.])", original, key)
    return key


def to_scaled_fp8(state: dict[str, torch.Tensor], style: str = "scaled_fp8",
                  per_row: bool = False) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """`state` as ComfyUI writes FP8 (2-D+ weights as float8_e4m3fn with their scales), and the float32 state it
    dequantizes to exactly (what a loader must reproduce). style "scaled_fp8": `scale_weight`, `scale_input` and
    the `scaled_fp8` marker; "mixed": `weight_scale`, `input_scale` and a `comfy_quant` entry per layer. per_row:
    one scale per output row instead of one per tensor."""
    legacy = style == "scaled_fp8"
    scale_name, input_name = ("scale_weight", "scale_input") if legacy else ("weight_scale", "input_scale")
    fp8: dict[str, torch.Tensor] = {}
    if legacy:
        fp8["scaled_fp8"] = torch.empty(0, dtype=torch.float8_e4m3fn)
    exact: dict[str, torch.Tensor] = {}
    for key, tensor in state.items():
        if not (key.endswith(".weight") and tensor.dim() >= 2):
            fp8[key] = exact[key] = tensor
            continue
        layer = key[: -len(".weight")]
        amax = tensor.abs().flatten(1).amax(1) if per_row else tensor.abs().max().reshape(1)
        scale = amax.clamp(min=1e-12) / 448.0  # e4m3fn's largest finite value
        shaped = scale.reshape(-1, *([1] * (tensor.dim() - 1)))
        quantized = (tensor / shaped).to(torch.float8_e4m3fn)
        fp8[key] = quantized
        fp8[f"{layer}.{scale_name}"] = scale.float()
        fp8[f"{layer}.{input_name}"] = torch.ones(1)
        if style == "mixed":
            fp8[f"{layer}.comfy_quant"] = torch.tensor(list(b'{"format": "float8_e4m3fn"}'), dtype=torch.uint8)
        exact[key] = quantized.float() * shaped
    return fp8, exact


def save(state: dict[str, torch.Tensor], path: Path) -> Path:
    save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    return path
