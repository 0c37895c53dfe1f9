"""Community LoRA key formats, rewritten to the diffusers/PEFT keys `files.read_lora_file` reads: the shared pieces,
and Wan's converter (Wan2.1, Wan2.2 and AnyFlow-FAR all read it). A family's own converter lives in its folder
(families/<name>/lora.py) and is named by its declaration (Family.lora.converter).

Each converter accepts what diffusers' loader for that family accepts (the `lora_state_dict` of its
LoraLoaderMixin and the converters it calls in lora_conversion_utils): the original repos' module names
(`diffusion_model.`), musubi-tuner's and Kohya sd-scripts' `lora_unet_` names. A file already in diffusers/PEFT
keys passes through unchanged. A key no rule understands is refused naming the file and the key, never dropped:
an adapter that silently lost layers would run and look fine.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from vidloom.core.errors import CheckpointError

Tensors = dict[str, torch.Tensor]
ORIGINAL_PREFIX = "diffusion_model."  # Lightricks, Wan, ai-toolkit: the original repo names under this prefix


# -- shared pieces of the community formats --------------------------------------------------------------------

# The factor suffixes community trainers write -> PEFT's. `.alpha` stays: files.py reads it as PEFT's lora_alpha
# (scaling alpha / r), the same update diffusers gets by folding alpha / r into the two factors.
_FACTORS = {"lora_down.weight": "lora_A.weight", "lora_A.weight": "lora_A.weight",
            "lora_up.weight": "lora_B.weight", "lora_B.weight": "lora_B.weight", "alpha": "alpha"}


def split_factor(key: str) -> tuple[str, str] | None:
    """"<module>.<factor>" -> (module, PEFT factor suffix); None when the key ends in no LoRA factor."""
    for suffix, peft in _FACTORS.items():
        if key.endswith("." + suffix):
            return key[: -len(suffix) - 1], peft
    return None


def not_understood(path: Path, key: str, fmt: str) -> CheckpointError:
    return CheckpointError(f"{path}: key {key!r} is not understood as a {fmt} LoRA key (no rule maps it to a "
                           "diffusers module)")


def drop_zero_norm_diff(path: Path, key: str, tensor: torch.Tensor) -> bool:
    """Full-weight `.diff` / `.diff_b` keys are no low-rank update. diffusers drops the norm ones (trainers write
    zeros there); so do we when they are zero. Any other is refused: it would change the model if applied."""
    if not key.endswith((".diff", ".diff_b")):
        return False
    if "norm" in key and not bool(tensor.any()):
        return True
    raise CheckpointError(f"{path}: key {key!r} is a full-weight difference (.diff / .diff_b), not a low-rank "
                          "factor; such adapters are not supported")


# -- Wan (Wan2.1, Wan2.2, AnyFlow-FAR: diffusers' WanLoraLoaderMixin) ------------------------------------------

# Wan's original repo module names (blocks.N.self_attn.q ...) -> diffusers', as diffusers'
# _convert_non_diffusers_wan_lora_to_diffusers maps them.
_WAN_ATTENTION = {"q": "to_q", "k": "to_k", "v": "to_v", "o": "to_out.0", "k_img": "add_k_proj", "v_img": "add_v_proj"}
_WAN_TOP = {"time_projection.1": "condition_embedder.time_proj", "head.head": "proj_out",
            "text_embedding.0": "condition_embedder.text_embedder.linear_1",
            "text_embedding.2": "condition_embedder.text_embedder.linear_2",
            "time_embedding.0": "condition_embedder.time_embedder.linear_1",
            "time_embedding.2": "condition_embedder.time_embedder.linear_2",
            "img_emb.proj.1": "condition_embedder.image_embedder.ff.net.0.proj",
            "img_emb.proj.3": "condition_embedder.image_embedder.ff.net.2"}
_WAN_BLOCK = re.compile(r"blocks\.(\d+)\.(self_attn|cross_attn|ffn)\.(q|k|v|o|k_img|v_img|0|2)")
# musubi-tuner writes the same modules flattened with underscores after `lora_unet_`.
_MUSUBI_BLOCK = re.compile(r"blocks_(\d+)_(self_attn|cross_attn|ffn)_(q|k|v|o|k_img|v_img|0|2)")
_MUSUBI_TOP = {name.replace(".", "_"): diffusers for name, diffusers in _WAN_TOP.items()}


def _wan_module(module: str, block: re.Pattern[str], top: dict[str, str]) -> str | None:
    if module in top:
        return top[module]
    match = block.fullmatch(module)
    if match is None:
        return None
    n, kind, part = match.groups()
    if kind == "ffn":
        return {"0": f"blocks.{n}.ffn.net.0.proj", "2": f"blocks.{n}.ffn.net.2"}.get(part)
    if part not in _WAN_ATTENTION or (kind == "self_attn" and part.endswith("_img")):
        return None
    return f"blocks.{n}.{'attn1' if kind == 'self_attn' else 'attn2'}.{_WAN_ATTENTION[part]}"


def wan_keys(path: Path, tensors: Tensors) -> Tensors:
    """Wan files from the original repo / ComfyUI (`diffusion_model.blocks.0.self_attn.q.lora_down.weight`, optional
    `.alpha`) and musubi-tuner (`lora_unet_blocks_0_self_attn_q.lora_down.weight`) -> `transformer.<diffusers>`."""
    if any(key.startswith(ORIGINAL_PREFIX) for key in tensors):
        prefix, fmt, block, top = ORIGINAL_PREFIX, "Wan original-repo", _WAN_BLOCK, _WAN_TOP
    elif any(key.startswith("lora_unet_") for key in tensors):
        prefix, fmt, block, top = "lora_unet_", "musubi-tuner Wan", _MUSUBI_BLOCK, _MUSUBI_TOP
    else:
        return tensors
    converted: Tensors = {}
    for key, tensor in tensors.items():
        if drop_zero_norm_diff(path, key, tensor):
            continue
        split = split_factor(key[len(prefix):]) if key.startswith(prefix) else None
        module = _wan_module(split[0], block, top) if split is not None else None
        if module is None:
            raise not_understood(path, key, fmt)
        converted[f"transformer.{module}.{split[1]}"] = tensor
    return converted
