"""Tiny AnyFlow-FAR models and pipelines written by diffusers (random weights, offline tokenizer).

Random init leaves the conditioning paths nearly inert (zero-initialised projections,
small embeddings), so a parity test could pass with a broken timestep or context
path. `perturb_far` adds noise everywhere and scales the embedding paths up so a
wrong (t, r), text or context moves the output clearly. It also sharpens
self-attention (q/k norm gains x2): at tiny sizes the generated chunk's queries see
~100 all-zero padding keys (ChunkLayout.null_keys) next to a few dozen real ones, and
with random-init logits a broken far-context path (compressed RoPE pooling, token
order) then moved the video by ~2 uint8 levels; with sharper logits, by 20+.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tests.helpers.wan_checkpoints import TINY_UMT5, reference_parts


@dataclass(frozen=True)
class TinyFar:
    """One tiny configuration of the AnyFlow-FAR architecture."""

    name: str
    transformer: dict[str, Any]
    vae: dict[str, Any] = field(default_factory=lambda: dict(
        base_dim=8, z_dim=4, dim_mult=[1, 2, 2, 2], num_res_blocks=1, attn_scales=[],
        temperal_downsample=[False, True, True], dropout=0.0,
    ))
    text_encoder: dict[str, Any] = field(default_factory=lambda: dict(TINY_UMT5))


FAR_A = TinyFar(
    name="far-a",
    transformer=dict(patch_size=(1, 2, 2), compressed_patch_size=(1, 4, 4), full_chunk_limit=3,
                     num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4, text_dim=32,
                     freq_dim=16, ffn_dim=32, num_layers=2, cross_attn_norm=True, rope_max_seq_len=64,
                     gate_value=0.25, deltatime_type="r", chunk_partition=(1, 2, 2)),
)
FAR_B = TinyFar(
    name="far-b",
    transformer=dict(patch_size=(1, 2, 2), compressed_patch_size=(1, 4, 4), full_chunk_limit=2,
                     num_attention_heads=3, attention_head_dim=16, in_channels=8, out_channels=8, text_dim=32,
                     freq_dim=32, ffn_dim=48, num_layers=3, cross_attn_norm=False, rope_max_seq_len=64,
                     gate_value=0.4, deltatime_type="t-r", chunk_partition=(1, 1, 2, 1)),
    vae=dict(base_dim=8, z_dim=8, dim_mult=[1, 2, 2, 2], num_res_blocks=1, attn_scales=[],
             temperal_downsample=[False, True, True], dropout=0.0),
)
FAR_CONFIGS = (FAR_A, FAR_B)

# Modules whose outputs carry the conditioning: scaled so a wrong input moves the output.
_SCALED = ("patch_embedding", "far_patch_embedding", "condition_embedder", "scale_shift_table")
# Self-attention q/k RMSNorm gains: x2 multiplies every self-attention logit by 4.
_SHARPENED = (".attn1.norm_q.", ".attn1.norm_k.")


def perturb_far(model: torch.nn.Module, seed: int, scale: float = 3.0) -> torch.nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.1)
            if name.startswith(_SCALED) or ".scale_shift_table" in name:
                p.mul_(scale)
            if any(part in name for part in _SHARPENED):
                p.mul_(2.0)
    return model


def reference_far_transformer(spec: TinyFar, seed: int = 0) -> torch.nn.Module:
    from diffusers import AnyFlowFARTransformer3DModel

    torch.manual_seed(seed)
    return perturb_far(AnyFlowFARTransformer3DModel(**spec.transformer).eval(), seed)


def reference_populated_step(
    ref: torch.nn.Module, latents: torch.Tensor, partition: list[int], index: int,
    t: float, r: float, text: torch.Tensor,
) -> torch.Tensor:
    """The reference's prediction for chunk `index` after prefilling chunks [0, index) of `latents`.

    latents: [B, F, C, H, W] (the reference's layout); drives the reference exactly as
    AnyFlowFARPipeline(use_kv_cache=True) does. Returns [B, F_chunk, C, H, W].
    """
    cfg = ref.config
    batch, _, _, height, width = latents.shape
    full_tpf = (height // cfg.patch_size[1]) * (width // cfg.patch_size[2])
    comp_tpf = (height // cfg.compressed_patch_size[1]) * (width // cfg.compressed_patch_size[2])
    # Sized as the pipeline sizes them.
    full_rows = cfg.full_chunk_limit * max(partition) * full_tpf
    comp_rows = max(1, len(partition) - cfg.full_chunk_limit + 1) * max(partition) * comp_tpf
    shape = (2, batch, cfg.num_attention_heads, 0, cfg.attention_head_dim)
    cache = {
        layer: {
            "full_cache": torch.zeros(shape[:3] + (full_rows,) + shape[4:]),
            "compressed_cache": torch.zeros(shape[:3] + (comp_rows,) + shape[4:]),
        }
        for layer in range(cfg.num_layers)
    }
    flag = {"num_cached_chunks": 0, "is_cache_step": False}
    with torch.no_grad():
        for k in range(index):
            prefix = partition[: k + 1]
            frames = sum(prefix)
            zeros = torch.zeros(batch, frames)
            mask = ref.build_attention_mask(chunk_partition=prefix, height=height, width=width, mode="cache")
            ref(hidden_states=latents[:, :frames], timestep=zeros, r_timestep=zeros, encoder_hidden_states=text,
                chunk_partition=prefix, attention_mask=mask, kv_cache=cache,
                kv_cache_flag={**flag, "is_cache_step": True}, return_dict=False)
            flag["num_cached_chunks"] += 1
        start, stop = sum(partition[:index]), sum(partition[: index + 1])
        steps = torch.full((batch, stop - start), t, dtype=torch.float64)
        targets = torch.full((batch, stop - start), r, dtype=torch.float64)
        out, _ = ref(hidden_states=latents[:, start:stop], timestep=steps, r_timestep=targets,
                     encoder_hidden_states=text, chunk_partition=partition[: index + 1], kv_cache=cache,
                     kv_cache_flag=copy.deepcopy(flag), return_dict=False)
    return out


def write_tiny_far(folder: Path, spec: TinyFar, seed: int = 0, shift: float = 5.0) -> Path:
    """Save an AnyFlowFARPipeline folder for `spec` with diffusers' own save_pretrained."""
    from diffusers import AnyFlowFARPipeline, FlowMapEulerDiscreteScheduler

    transformer = reference_far_transformer(spec, seed)
    parts = reference_parts(spec, seed, vae_seed=seed + 1, text_seed=seed + 2)
    scheduler = FlowMapEulerDiscreteScheduler(num_train_timesteps=1000, shift=shift)
    pipe = AnyFlowFARPipeline(**parts, transformer=transformer, scheduler=scheduler)
    pipe.save_pretrained(str(folder))
    return folder
