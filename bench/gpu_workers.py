"""Work done inside the GPU check's processes: write the random 1.3B checkpoint, run one configuration.

Each configuration runs in its own process (`gpu_check.py --worker NAME`): a CUDA error
or a crash in one kernel cannot poison the next row, and peak memory is per configuration.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from gpu_plan import (
    CONFIGS, GUIDANCE, HEIGHT, NUM_FRAMES, TIMED_STEPS, WAN_1_3B, WARMUP_STEPS, WIDTH, DitRow, GpuConfig,
)

PROMPT = "a red fox runs through fresh snow in a pine forest, morning light"
NEGATIVE = "blurry, low quality, distorted"
SEED = 42

# Wan-AI/Wan2.1-T2V-1.3B-Diffusers vae/config.json (latent statistics: random here).
WAN_VAE: dict[str, Any] = dict(base_dim=96, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2, attn_scales=[],
                               temperal_downsample=[False, True, True], dropout=0.0)
# Text encoder: a small random UMT5 of UMT5-XXL's width (4096, what the DiT reads) and head layout,
# 2 layers, over the demo's offline-trained tokenizer. Real prompt encoding is not what is timed.
SMALL_UMT5: dict[str, Any] = dict(d_model=4096, d_kv=64, d_ff=1024, num_layers=2, num_heads=64,
                                  relative_attention_num_buckets=32, relative_attention_max_distance=128,
                                  feed_forward_proj="gated-gelu", dropout_rate=0.0)


@dataclass(frozen=True)
class Workload:
    """What one check runs: the real one by default; tests pass a tiny one on CPU."""

    transformer: dict[str, Any] = field(default_factory=lambda: dict(WAN_1_3B))
    vae: dict[str, Any] = field(default_factory=lambda: dict(WAN_VAE))
    text_encoder: dict[str, Any] = field(default_factory=lambda: dict(SMALL_UMT5))
    height: int = HEIGHT
    width: int = WIDTH
    num_frames: int = NUM_FRAMES
    device: str = "cuda"
    dtype: str = "bfloat16"


REAL = Workload()


def write_checkpoint(folder: Path, work: Workload = REAL, seed: int = 0) -> Path:
    """A WanPipeline folder with the published 1.3B DiT/VAE architecture and random weights in `work.dtype`.

    Built on the device (seconds instead of minutes of CPU init) and saved with diffusers' own
    save_pretrained, so both sides load the very same files.
    """
    import torch
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    from vidloom.demo.tokenizer import train_t5_tokenizer
    from vidloom.families.wan.demo import WAN21_SCHEDULER

    torch.manual_seed(seed)
    dtype = getattr(torch, work.dtype)
    z_dim = work.vae["z_dim"]
    tokenizer = train_t5_tokenizer()
    with torch.device(work.device):
        transformer = WanTransformer3DModel(**work.transformer)
        vae = AutoencoderKLWan(**work.vae, latents_mean=[0.0] * z_dim, latents_std=[1.0] * z_dim)
        text_encoder = UMT5EncoderModel(UMT5Config(vocab_size=len(tokenizer), **work.text_encoder))
    with torch.no_grad():  # diffusers zero-initialises some projections: keep every path live
        for module in (transformer, vae):
            for param in module.parameters():
                param.add_(torch.randn_like(param) * 0.02)
    scheduler = UniPCMultistepScheduler(**{k: v for k, v in WAN21_SCHEDULER.items() if not k.startswith("_")})
    pipe = WanPipeline(tokenizer=tokenizer, text_encoder=text_encoder.to(dtype).cpu(),
                       transformer=transformer.to(dtype).cpu(), vae=vae.cpu(), scheduler=scheduler)
    partial = folder.with_name(folder.name + ".partial")
    pipe.save_pretrained(str(partial))
    partial.rename(folder)
    return folder


def run_worker(name: str, checkpoint: Path, latents_path: Path, work: Workload = REAL) -> dict[str, Any]:
    """Run configuration `name`; save its final latents; return its measurements."""
    import torch

    config = {c.name: c for c in CONFIGS}[name]
    runner = _run_diffusers if config.engine == "diffusers" else _run_vidloom
    started = time.perf_counter()
    result, latents = runner(config, checkpoint, work)
    torch.save(latents.float().cpu(), latents_path)
    result["worker_s"] = round(time.perf_counter() - started, 2)
    result["finite"] = bool(torch.isfinite(latents).all())
    return result


def _sync_clock() -> float:
    import torch

    if torch.cuda.is_initialized():
        torch.cuda.synchronize()
    return time.perf_counter()


def _reset_peak() -> None:
    import torch

    if torch.cuda.is_initialized():
        torch.cuda.reset_peak_memory_stats()


def _peak_gib() -> float | None:
    import torch

    return round(torch.cuda.max_memory_allocated() / 2**30, 2) if torch.cuda.is_initialized() else None


def _step_summary(ends: list[float]) -> dict[str, Any]:
    intervals = [b - a for a, b in zip(ends, ends[1:])]
    return {"s_per_step": round(statistics.median(intervals), 4), "step_intervals_s": [round(x, 4) for x in intervals]}


def _run_vidloom(config: GpuConfig, checkpoint: Path, work: Workload) -> tuple[dict[str, Any], Any]:
    import torch

    from vidloom import registry
    from vidloom.core import plugin
    from vidloom.core.deploy import DeployConfig
    from vidloom.core.output import ProgressEvent
    from vidloom.core.program import Program
    from vidloom.core.request import GenerationRequest
    from vidloom.runtime.engine import Engine

    options = dict(config.deploy)
    if options.get("compile"):
        options["warmup_shapes"] = ((work.height, work.width, work.num_frames),)  # the compiled bucket
    deploy = DeployConfig(**options)
    t0 = _sync_clock()
    card = registry.resolve_card(checkpoint)
    instance = registry.load_instance(card, checkpoint, torch.device(work.device), getattr(torch, work.dtype), deploy)
    full = plugin.resolve(card.program)(instance)
    # The check times denoising and compares latents: the same program without the VAE decode.
    program = Program(nodes=tuple(n for n in full.nodes if n.name != "decode"), inputs=full.inputs,
                      outputs=("latents",))
    engine = Engine(instance, program)
    t1 = _sync_clock()
    engine.warmup(deploy.warmup_shapes, steps=WARMUP_STEPS)  # compiles the bucket (compile only)

    def request(steps: int) -> GenerationRequest:
        return GenerationRequest(PROMPT, negative_prompt=NEGATIVE, height=work.height, width=work.width,
                                 num_frames=work.num_frames, num_inference_steps=steps, guidance_scale=GUIDANCE,
                                 seed=SEED)

    engine.run(request(WARMUP_STEPS))  # kernels initialised; the graph captured (cuda-graphs)
    t2 = _sync_clock()
    _reset_peak()
    ends: list[float] = []

    def on_event(event: object) -> None:
        if isinstance(event, ProgressEvent) and event.phase == "denoise":
            ends.append(_sync_clock())

    latents = engine.run(request(TIMED_STEPS), on_event=on_event)["latents"]
    extra: dict[str, Any] = {}
    if engine.graph_stats is not None:
        extra["cuda_graphs"] = engine.graph_stats  # fallbacks > 0: some steps ran eagerly
    if deploy.compile:
        extra["compile_misses"] = engine.compile_misses
    return {
        **_step_summary(ends), **extra,
        "load_s": round(t1 - t0, 2), "setup_s": round(t2 - t1, 2), "peak_memory_gib": _peak_gib(),
    }, latents


def _run_diffusers(config: GpuConfig, checkpoint: Path, work: Workload) -> tuple[dict[str, Any], Any]:
    import torch
    from diffusers import WanPipeline

    t0 = _sync_clock()
    pipe = WanPipeline.from_pretrained(str(checkpoint), dtype=getattr(torch, work.dtype)).to(work.device)
    pipe.set_progress_bar_config(disable=True)
    t1 = _sync_clock()
    ends: list[float] = []

    def on_step_end(_pipe: Any, _i: int, _t: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
        ends.append(_sync_clock())
        return kwargs

    def generate(steps: int, callback: Callable[..., dict[str, Any]] | None) -> Any:
        return pipe(prompt=PROMPT, negative_prompt=NEGATIVE, height=work.height, width=work.width,
                    num_frames=work.num_frames,
                    num_inference_steps=steps, guidance_scale=GUIDANCE, output_type="latent",
                    generator=torch.Generator("cpu").manual_seed(SEED), callback_on_step_end=callback).frames

    generate(WARMUP_STEPS, None)
    t2 = _sync_clock()
    _reset_peak()
    latents = generate(TIMED_STEPS, on_step_end)
    return {
        **_step_summary(ends), "load_s": round(t1 - t0, 2), "setup_s": round(t2 - t1, 2), "peak_memory_gib": _peak_gib(),
    }, latents


def print_result(result: dict[str, Any]) -> None:
    print("RESULT " + json.dumps(result), flush=True)


def run_dit_worker(row: DitRow, device: str = "cuda", dtype: str = "bfloat16") -> dict[str, Any]:
    """Time `row`'s denoiser alone: built at its published size with random weights, a CFG pair per step.

    Same casting as a load (KEEP_FP32 islands in float32), SDPA attention, inputs of the row's token grid.
    """
    import torch

    from vidloom.layers.attention import resolve_attention
    from vidloom.loading.precision import cast_module
    from vidloom.models.wan.transformer import WanTransformer
    from vidloom.models.wan.transformer_config import WanTransformerConfig

    torch.manual_seed(SEED)
    compute, where = getattr(torch, dtype), torch.device(device)
    config = WanTransformerConfig.from_diffusers(row.transformer)
    t0 = _sync_clock()
    with torch.device(where):
        model = WanTransformer(config, resolve_attention("sdpa", where, compute))
    cast_module(model, compute, WanTransformer.KEEP_FP32).eval()
    frames = (row.num_frames - 1) // row.vae_temporal + 1
    latents = torch.randn(2, config.in_channels, frames, row.height // row.vae_spatial,
                          row.width // row.vae_spatial, device=where, dtype=compute)
    text = torch.randn(2, 512, config.text_dim, device=where, dtype=compute)
    timestep = torch.full((2,), 500.0, device=where)
    t1 = _sync_clock()
    with torch.inference_mode():
        for _ in range(WARMUP_STEPS):
            model(latents, timestep, text)
        _reset_peak()
        ends = [_sync_clock()]
        for _ in range(TIMED_STEPS):
            out = model(latents, timestep, text)
            ends.append(_sync_clock())
    step = _step_summary(ends)
    return {**step, "build_s": round(t1 - t0, 2), "peak_memory_gib": _peak_gib(), "tokens": row.tokens(),
            "flops_per_step": row.step_flops(), "finite": bool(torch.isfinite(out).all())}
