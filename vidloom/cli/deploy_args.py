"""Command-line flags for DeployConfig, shared by `vidloom generate` and `vidloom serve`."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from vidloom.core.deploy import COMPILE_BACKENDS, DeployConfig
from vidloom.core.parallel import ParallelPlan


def add_deploy_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("deployment (performance and memory)")
    group.add_argument("--fp8", action="store_true", help="FP8 (e4m3) weights for the DiT block linears")
    group.add_argument("--compile", action="store_true", help="torch.compile the DiT blocks")
    group.add_argument("--cuda-graphs", action="store_true", help="capture and replay each denoise step as a CUDA graph")
    group.add_argument("--compile-backend", default="inductor", choices=COMPILE_BACKENDS,
                       help="torch.compile backend (with --compile); aot_eager / eager trace without kernels")
    group.add_argument("--warmup", action="append", default=[], metavar="HxWxF", type=_shape,
                       help="run a short request at this size at load (repeatable), e.g. 480x832x81")
    group.add_argument("--offload-text-encoder", action="store_true",
                       help="keep the text encoder in CPU memory between encodes")
    group.add_argument("--offload-idle-expert", action="store_true",
                       help="two-expert models (Wan2.2 A14B): keep the idle expert in CPU memory")
    group.add_argument("--prompt-cache", type=int, default=0, metavar="N", help="cache N prompt embeddings")
    group.add_argument("--kv-cache-budget-mb", type=float, default=None, metavar="MB",
                       help="KV cache (causal video) all running requests may hold together (default: no limit)")
    group.add_argument("--kv-pool-tokens", type=int, default=None, metavar="N",
                       help="chat models: tokens of paged KV cache shared by running chats (default 16384)")
    group.add_argument("--kv-session-ttl", type=float, default=0.0, metavar="SECONDS",
                       help="keep a finished causal video's KV resident this long for extend_from (default 0: off)")
    group.add_argument("--vae-tile", type=int, default=None, metavar="PIXELS", help="decode in tiles of this many pixels (audio VAEs: waveform samples)")
    group.add_argument("--vae-tile-stride", type=int, default=None, metavar="PIXELS",
                       help="pixels (audio: samples) between tile starts (default 3/4 of --vae-tile)")
    group.add_argument("--attention-backend", default="sdpa", metavar="NAME",
                       help="attention kernel: sdpa | math (SDPA's math kernel) | flash (flash-attn) | "
                            "sage (SageAttention); default sdpa")
    group.add_argument("--cfg-mode", default="sequential", metavar="MODE",
                       help="sequential (two forwards per step) | batched (one forward of batch 2)")
    group.add_argument("--step-cache", default="none", metavar="POLICY",
                       help="none | teacache | fbcache | dbcache | fast | balanced | quality: reuse DiT block "
                            "residuals on steps that barely change (docs/acceleration.md)")
    group.add_argument("--step-cache-threshold", type=float, default=None, metavar="T",
                       help="step-cache threshold (the policy's default; 0 never skips, higher skips more)")
    dbcache = parser.add_argument_group("DBCache step caches (dbcache, fbcache, fast, balanced, quality)")
    dbcache.add_argument("--step-cache-fn", type=int, default=None, metavar="N",
                         help="front blocks computed every step (their residual decides)")
    dbcache.add_argument("--step-cache-bn", type=int, default=None, metavar="N", help="back blocks computed every step")
    dbcache.add_argument("--step-cache-warmup", type=int, default=None, metavar="STEPS",
                         help="first steps of each CFG branch that always compute")
    dbcache.add_argument("--step-cache-max-cached", type=int, default=None, metavar="STEPS",
                         help="most steps a branch may cache (-1: no limit)")
    dbcache.add_argument("--step-cache-max-continuous", type=int, default=None, metavar="STEPS",
                         help="most steps a branch may cache in a row (-1: no limit)")
    dbcache.add_argument("--step-cache-taylorseer", type=int, default=None, metavar="ORDER",
                         help="TaylorSeer order forecasting the reused residual: 0 (reuse as is), 1 or 2")
    dbcache.add_argument("--step-cache-mask", default=None, metavar="[static:]BITS",
                         help="one 1 (compute) or 0 (may cache) per step, e.g. 11110101011; static: caches the 0 "
                              "steps unmeasured")
    group.add_argument("--component", action="append", default=[], metavar="NAME=FILE", type=_component,
                       help="load component NAME (transformer, transformer_2, vae) from one .safetensors or .gguf "
                            "file instead of the checkpoint folder (repeatable; docs/loading-checkpoints.md)")
    stages = parser.add_argument_group("multi-stage models (LTX-2)")
    stages.add_argument("--two-stage", action="store_true",
                        help="generate, upsample the latents 2x, refine (upsampler: --upsampler or the "
                             "checkpoint's latent_upsampler/ folder)")
    stages.add_argument("--upsampler", default=None, metavar="DIR",
                        help="latent upsampler folder (LTX2LatentUpsamplerModel or LTX2LatentUpsamplePipeline); "
                             "implies --two-stage")
    stages.add_argument("--stage2-lora", default=None, metavar="PATH[:SCALE]",
                        help="LoRA applied in the second stage only (LTX-2's distilled refinement LoRA); "
                             "needs --two-stage or --upsampler")
    multi = parser.add_argument_group("several devices (one process each; see README 'Multiple devices')")
    multi.add_argument("--devices", type=int, default=None, metavar="N",
                       help="processes, one per device (default: --sp x cfg degree, or torchrun's world size)")
    multi.add_argument("--sp", type=int, default=1, metavar="K",
                       help="sequence-parallel degree (Ulysses; ring attention where it does not divide the heads); Wan needs "
                            "it to divide each request's token count")
    multi.add_argument("--cfg-parallel", type=int, nargs="?", const=2, default=None, metavar="N",
                       help="run the cond and uncond CFG branches on two devices (needs guidance > 1); N up to 4 "
                            "spreads a step's further guidance passes too (LTX-2: STG, isolated modality)")
    multi.add_argument("--shard-weights", action="store_true",
                       help="each rank of the --sp group holds 1/sp of every denoiser block's weights, gathered "
                            "just before the block runs (less memory per device; not with --compile, --fp8, "
                            "--cuda-graphs)")
    multi.add_argument("--text-encoder-rank", type=int, default=None, metavar="R",
                       help="only rank R loads the text encoder(s) and encodes the prompts, broadcasting the "
                            "encoded prompt to the other ranks, which never hold the encoder's weights")


def deploy_config(args: argparse.Namespace, launched_world: int | None = None) -> DeployConfig:
    """`launched_world`: processes a launcher (torchrun) already started, the default for --devices."""
    plan = ParallelPlan(sp=args.sp, cfg=args.cfg_parallel or 1, shard_weights=args.shard_weights,
                        text_encoder_rank=args.text_encoder_rank)
    devices = args.devices if args.devices is not None else (launched_world or plan.world_size)
    return DeployConfig(
        fp8_weights=args.fp8,
        compile=args.compile,
        cuda_graphs=args.cuda_graphs,
        compile_backend=args.compile_backend,
        warmup_shapes=tuple(args.warmup),
        offload_text_encoder=args.offload_text_encoder,
        prompt_cache_size=args.prompt_cache,
        offload_idle_expert=args.offload_idle_expert,
        kv_cache_budget_bytes=None if args.kv_cache_budget_mb is None else max(1, int(args.kv_cache_budget_mb * 2**20)),
        kv_pool_tokens=args.kv_pool_tokens,
        kv_session_ttl_s=args.kv_session_ttl,
        vae_tile=args.vae_tile,
        vae_tile_stride=args.vae_tile_stride,
        attention_backend=args.attention_backend,
        cfg_mode=args.cfg_mode,
        step_cache=args.step_cache,
        step_cache_threshold=args.step_cache_threshold,
        step_cache_fn=args.step_cache_fn,
        step_cache_bn=args.step_cache_bn,
        step_cache_warmup=args.step_cache_warmup,
        step_cache_max_cached=args.step_cache_max_cached,
        step_cache_max_continuous=args.step_cache_max_continuous,
        step_cache_taylorseer=args.step_cache_taylorseer,
        step_cache_mask=args.step_cache_mask,
        two_stage=args.two_stage,
        upsampler=args.upsampler,
        stage2_lora=args.stage2_lora,
        components=tuple(args.component),
        devices=devices,
        parallel=plan,
    )


def _shape(text: str) -> tuple[int, int, int]:
    match = re.fullmatch(r"(\d+)x(\d+)x(\d+)", text)
    if not match:
        raise argparse.ArgumentTypeError(f"expected HEIGHTxWIDTHxFRAMES like 480x832x81, got {text!r}")
    height, width, frames = (int(g) for g in match.groups())
    return height, width, frames


def _component(text: str) -> tuple[str, str]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=FILE like transformer=wan2.1_t2v_1.3B.safetensors, got {text!r}")
    return name, str(Path(path).expanduser().absolute())
