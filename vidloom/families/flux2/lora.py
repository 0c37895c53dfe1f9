"""FLUX.2 LoRA files from ai-toolkit / BFL's repo and Kohya's sd-scripts, rewritten to diffusers/PEFT keys
(diffusers' Flux2LoraLoaderMixin)."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from vidloom.core.errors import CheckpointError
from vidloom.lora.formats import ORIGINAL_PREFIX, Tensors, not_understood, split_factor

# -- Flux2 (diffusers' Flux2LoraLoaderMixin) --------------------------------------------------------------------

# BFL's module names as ai-toolkit writes them -> diffusers' (_convert_non_diffusers_flux2_lora_to_diffusers).
_FLUX2_TOP = {"img_in": "x_embedder", "txt_in": "context_embedder",
              "time_in.in_layer": "time_guidance_embed.timestep_embedder.linear_1",
              "time_in.out_layer": "time_guidance_embed.timestep_embedder.linear_2",
              "guidance_in.in_layer": "time_guidance_embed.guidance_embedder.linear_1",
              "guidance_in.out_layer": "time_guidance_embed.guidance_embedder.linear_2",
              "final_layer.linear": "proj_out", "final_layer.adaLN_modulation.1": "norm_out.linear",
              "single_stream_modulation.lin": "single_stream_modulation.linear",
              "double_stream_modulation_img.lin": "double_stream_modulation_img.linear",
              "double_stream_modulation_txt.lin": "double_stream_modulation_txt.linear"}
_FLUX2_DOUBLE = {"img_attn.proj": "attn.to_out.0", "txt_attn.proj": "attn.to_add_out",
                 "img_mlp.0": "ff.linear_in", "img_mlp.2": "ff.linear_out",
                 "txt_mlp.0": "ff_context.linear_in", "txt_mlp.2": "ff_context.linear_out"}
# A fused qkv LoRA becomes three: the same down factor, the up factor's rows split in three.
_FLUX2_QKV = {"img_attn.qkv": ("attn.to_q", "attn.to_k", "attn.to_v"),
              "txt_attn.qkv": ("attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj")}
_FLUX2_SINGLE = {"linear1": "attn.to_qkv_mlp_proj", "linear2": "attn.to_out"}
# Some exports already use diffusers' block names (and one an alias for them).
_FLUX2_EXPANDED = {"single_transformer_blocks.": "single_transformer_blocks.",
                   "transformer_blocks.": "transformer_blocks.", "sformer_blocks.": "transformer_blocks."}
_FLUX2_BLOCK = re.compile(r"(double_blocks|single_blocks)\.(\d+)\.(.+)")


def _flux2_modules(module: str) -> tuple[str, ...] | None:
    """The diffusers module(s) one ai-toolkit module feeds (three for a fused qkv); None: no rule."""
    if module in _FLUX2_TOP:
        return (_FLUX2_TOP[module],)
    for source, target in _FLUX2_EXPANDED.items():
        if module.startswith(source):
            return (target + module[len(source):],)
    match = _FLUX2_BLOCK.fullmatch(module)
    if match is None:
        return None
    kind, n, rest = match.groups()
    if kind == "single_blocks":
        return (f"single_transformer_blocks.{n}.{_FLUX2_SINGLE[rest]}",) if rest in _FLUX2_SINGLE else None
    if rest in _FLUX2_QKV:
        return tuple(f"transformer_blocks.{n}.{name}" for name in _FLUX2_QKV[rest])
    return (f"transformer_blocks.{n}.{_FLUX2_DOUBLE[rest]}",) if rest in _FLUX2_DOUBLE else None


def flux2_keys(path: Path, tensors: Tensors) -> Tensors:
    """Flux2 files from ai-toolkit / BFL's repo (`diffusion_model.double_blocks.0.img_attn.qkv.lora_A.weight`, or
    lora_down / lora_up) and Kohya's sd-scripts (`lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight`, with
    `.alpha`) -> `transformer.<diffusers>`."""
    if any(key.startswith(_KOHYA) for key in tensors):
        return _flux2_kohya_keys(path, tensors)
    if not any(key.startswith(ORIGINAL_PREFIX) for key in tensors):
        return tensors
    converted: Tensors = {}
    for key, tensor in tensors.items():
        split = split_factor(key[len(ORIGINAL_PREFIX):]) if key.startswith(ORIGINAL_PREFIX) else None
        modules = _flux2_modules(split[0]) if split is not None else None
        if modules is None:
            raise not_understood(path, key, "ai-toolkit Flux2")
        module, factor = split
        if len(modules) == 3 and factor == "lora_B.weight":
            if tensor.shape[0] % 3:
                raise CheckpointError(f"{path}: {key!r} has {tensor.shape[0]} rows, not a fused q/k/v (3 x d)")
            parts: tuple[torch.Tensor, ...] = tuple(torch.chunk(tensor, 3, dim=0))
        else:
            parts = (tensor,) * len(modules)
        for name, part in zip(modules, parts):
            converted[f"transformer.{name}.{factor}"] = part.contiguous()
    return converted


# -- Flux2 as Kohya's sd-scripts writes it (diffusers' _convert_kohya_flux2_lora_to_diffusers) -------------------

_KOHYA = "lora_unet_"
# Kohya flattens BFL's module names with underscores; these are the ones diffusers' Kohya Flux2 converter maps
# (others, such as the modulation linears, it drops with a warning; we refuse them).
_KOHYA_FLUX2_TOP = {"img_in": "img_in", "txt_in": "txt_in", "time_in_in_layer": "time_in.in_layer",
                    "time_in_out_layer": "time_in.out_layer", "final_layer_linear": "final_layer.linear"}
_KOHYA_FLUX2_DOUBLE = ("img_attn_proj", "img_attn_qkv", "txt_attn_proj", "txt_attn_qkv", "img_mlp_0", "img_mlp_2",
                       "txt_mlp_0", "txt_mlp_2")
_KOHYA_FLUX2_BLOCK = re.compile(r"(double_blocks|single_blocks)_(\d+)_(.+)")


def _kohya_flux2_module(name: str) -> str | None:
    """`double_blocks_0_img_attn_qkv` -> `double_blocks.0.img_attn.qkv` (the ai-toolkit name); None: no rule."""
    if name in _KOHYA_FLUX2_TOP:
        return _KOHYA_FLUX2_TOP[name]
    match = _KOHYA_FLUX2_BLOCK.fullmatch(name)
    if match is None:
        return None
    kind, n, rest = match.groups()
    if kind == "single_blocks":
        return f"single_blocks.{n}.{rest}" if rest in ("linear1", "linear2") else None
    if rest not in _KOHYA_FLUX2_DOUBLE:
        return None
    head, _, last = rest.rpartition("_")  # img_attn_qkv -> img_attn.qkv, txt_mlp_0 -> txt_mlp.0
    return f"double_blocks.{n}.{head}.{last}"


def _flux2_kohya_keys(path: Path, tensors: Tensors) -> Tensors:
    """Kohya's factors keep their `.alpha` (files.py reads it as PEFT's lora_alpha: scaling alpha / r, the update
    diffusers gets by folding alpha / r into the factors). A fused qkv becomes three adapters: when its up factor
    is block-diagonal (rank 3r, each projection trained with its own r rows, as sd-scripts' split-qkv option writes
    it) each projection keeps its own r-row slice of the down factor, as diffusers' "sparse" case; else the one
    down factor is shared and the up factor's rows are split in three."""
    modules: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        split = split_factor(key[len(_KOHYA):]) if key.startswith(_KOHYA) else None
        module = _kohya_flux2_module(split[0]) if split is not None else None
        if module is None or split is None or split[1] not in ("lora_A.weight", "lora_B.weight", "alpha"):
            raise not_understood(path, key, "Kohya Flux2")
        modules.setdefault(module, {})[split[1]] = tensor
    converted: Tensors = {}
    for module, factors in modules.items():
        targets = _flux2_modules(module)
        assert targets is not None  # every name _kohya_flux2_module returns has an ai-toolkit rule
        down, up = factors.get("lora_A.weight"), factors.get("lora_B.weight")
        if down is None or up is None:
            key = next(k for k in tensors if _kohya_flux2_module(k[len(_KOHYA):].partition(".")[0]) == module)
            raise CheckpointError(f"{path}: key {key!r} has no {'lora_up' if up is None else 'lora_down'} partner "
                                  "(each Kohya layer needs lora_down and lora_up)")
        alpha = factors.get("alpha")
        pieces = _split_qkv(path, module, down, up) if len(targets) == 3 else [(down, up)]
        for name, (piece_down, piece_up) in zip(targets, pieces):
            prefix = f"transformer.{name}"
            converted[f"{prefix}.lora_A.weight"] = piece_down.contiguous()
            converted[f"{prefix}.lora_B.weight"] = piece_up.contiguous()
            if alpha is not None:  # alpha is per rank: a 3r-row slice of r rows keeps alpha / 3r as its scaling
                rank_share = piece_down.shape[0] / down.shape[0]
                converted[f"{prefix}.alpha"] = alpha.float() * rank_share
    return converted


def _split_qkv(path: Path, module: str, down: torch.Tensor, up: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    if up.shape[0] % 3 or up.shape[1] != down.shape[0]:
        raise CheckpointError(f"{path}: {module} lora_up {tuple(up.shape)} is not a fused q/k/v (3 x d rows) "
                              f"over lora_down {tuple(down.shape)}")
    rows, rank = up.shape[0] // 3, down.shape[0]
    if rank % 3 == 0:
        r = rank // 3
        blocks = [up[i * rows:(i + 1) * rows] for i in range(3)]
        off_diagonal_zero = all(not bool(blocks[i][:, j * r:(j + 1) * r].any())
                                for i in range(3) for j in range(3) if i != j)
        if off_diagonal_zero:
            return [(down[i * r:(i + 1) * r], blocks[i][:, i * r:(i + 1) * r]) for i in range(3)]
    return [(down, part) for part in torch.chunk(up, 3, dim=0)]
