"""The GPU check's LoRA row: a denoiser at its published size timed with 0, 1 and 4 adapters, run-time vs fused.

Run-time adapters go through vidloom's own wrapper (vidloom.lora.apply: LoRALinear under a lora_scope), the
path a request with `loras` takes; fused ones are added into the weights as vidloom.lora.fuse does
(W + scale * alpha / r * B A), which is the plain model's step plus nothing. Each fused setting starts from
the saved base weights, so the 4-adapter fuse is not stacked on the 1-adapter one.
"""

from __future__ import annotations

from typing import Any

from gpu_plan import LoraRow
from gpu_workers import SEED, _peak_gib, _reset_peak, _step_summary, _sync_clock

# The linears a style LoRA usually trains on a Wan block (diffusers' attn1/attn2 q,k,v,out and the FFN), by our
# module names (vidloom.models.wan.transformer_config.WAN_TRANSFORMER_NAME_MAP).
TARGETS = ("self_attn.q", "self_attn.k", "self_attn.v", "self_attn.out", "cross_attn.q", "cross_attn.k",
           "cross_attn.v", "cross_attn.out", "ffn.up", "ffn.down")


def run_lora_worker(row: LoraRow, device: str = "cuda", dtype: str = "bfloat16") -> dict[str, Any]:
    """Seconds per CFG-pair forward for every setting of `row` (`settings`), plus the base step and its MFU inputs."""
    import torch

    from vidloom.layers.attention import resolve_attention
    from vidloom.loading.precision import cast_module
    from vidloom.lora.apply import ActiveLoRAs, lora_scope, wrap_linears
    from vidloom.lora.files import LoRALayer
    from vidloom.models.wan.transformer import WanTransformer
    from vidloom.models.wan.transformer_config import WanTransformerConfig

    torch.manual_seed(SEED)
    compute, where = getattr(torch, dtype), torch.device(device)
    config = WanTransformerConfig.from_diffusers(row.transformer)
    with torch.device(where):
        model = WanTransformer(config, resolve_attention("sdpa", where, compute))
    cast_module(model, compute, WanTransformer.KEEP_FP32).eval()
    names = [f"blocks.{i}.{t}" for i in range(len(model.blocks)) for t in TARGETS]
    linears = {name: model.get_submodule(name) for name in names}
    base = {name: linear.weight.detach().clone() for name, linear in linears.items()}
    g = torch.Generator(device=where).manual_seed(SEED)
    adapters = [{name: LoRALayer(torch.randn(row.rank, lin.in_features, generator=g, device=where, dtype=compute) * 0.01,
                                 torch.randn(lin.out_features, row.rank, generator=g, device=where, dtype=compute) * 0.01,
                                 1.0) for name, lin in linears.items()} for _ in range(max(row.counts))]
    frames = (row.num_frames - 1) // row.vae_temporal + 1
    latents = torch.randn(2, config.in_channels, frames, row.height // row.vae_spatial,
                          row.width // row.vae_spatial, device=where, dtype=compute)
    text = torch.randn(2, 512, config.text_dim, device=where, dtype=compute)
    timestep = torch.full((2,), 500.0, device=where)
    results: dict[str, Any] = {}
    _reset_peak()
    with torch.inference_mode():
        for mode, count in row.settings():
            active, fuse_s = None, None
            for name, linear in linears.items():
                linear.weight.copy_(base[name])
            if mode == "fused":
                t0 = _sync_clock()
                for name, linear in linears.items():
                    delta = sum(a[name].up.float() @ a[name].down.float() for a in adapters[:count])
                    linear.weight.copy_((linear.weight.float() + delta).to(linear.weight.dtype))
                fuse_s = round(_sync_clock() - t0, 3)
            elif mode == "run-time":
                wrap_linears(model, "transformer", names)  # once; the wrapper adds nothing outside a scope
                active = ActiveLoRAs({f"transformer:{name}": tuple((a[name], 1.0) for a in adapters[:count])
                                      for name in names})
            with lora_scope(active):
                model(latents, timestep, text)  # warm
                ends = [_sync_clock()]
                for _ in range(row.timed):
                    out = model(latents, timestep, text)
                    ends.append(_sync_clock())
            results[f"{mode} {count}"] = {**_step_summary(ends), **({"fuse_s": fuse_s} if fuse_s is not None else {}),
                                          "finite": bool(torch.isfinite(out).all())}
    plain = results["base 0"]["s_per_step"]
    return {"s_per_step": plain, "settings": results, "rank": row.rank, "targets_per_block": len(TARGETS),
            "vs_base": {k: round(v["s_per_step"] / plain, 3) for k, v in results.items()},
            "peak_memory_gib": _peak_gib(), "tokens": row.tokens(), "flops_per_step": row.step_flops()}
