"""AnyFlow-FAR rollout: KV-cached vs recompute, time to first chunk, and vidloom vs diffusers.

Each (configuration, length) runs in a fresh subprocess (comparable peak RSS, no shared
warm caches) on a random-weight checkpoint written by diffusers. A process loads the
model, warms up on a 1-step request, then times the rollout (text encoding, noise,
every chunk; no VAE decode, which is the same Wan VAE for all and would dominate on CPU).
A separate vidloom-full process times a whole generation (with decode) for the time to
the first finished chunk against the total. Ratios: recompute over KV-cached (expected to
grow with the chunk count: recompute re-runs the whole prefix at every step) and
diffusers AnyFlowFARPipeline(use_kv_cache=True) over vidloom, wall time and peak RSS.

    python bench/far_rollout.py [--frames 17,41,65] [--steps 4] [--configs vidloom,vidloom-recompute,diffusers]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from report import environment, print_table, wait_for_quiet, write_json  # noqa: E402
from tests.helpers.far_checkpoints import TinyFar, write_tiny_far  # noqa: E402

CACHE = ROOT / "bench" / ".cache"
PROMPT = "a red fox jumps over a frozen river"
SEED = 42
MID = TinyFar(
    name="far-mid",
    transformer=dict(patch_size=(1, 2, 2), compressed_patch_size=(1, 4, 4), full_chunk_limit=3,
                     num_attention_heads=8, attention_head_dim=64, in_channels=16, out_channels=16, text_dim=64,
                     freq_dim=256, ffn_dim=1536, num_layers=4, cross_attn_norm=True, rope_max_seq_len=1024,
                     gate_value=0.25, deltatime_type="r", chunk_partition=(1, 3, 3, 3, 1)),
    vae=dict(base_dim=32, z_dim=16, dim_mult=[1, 2, 2, 2], num_res_blocks=1, attn_scales=[],
             temperal_downsample=[False, True, True], dropout=0.0),
    text_encoder={"d_model": 64, "d_kv": 16, "d_ff": 128, "num_layers": 2, "num_heads": 4,
                  "relative_attention_num_buckets": 8, "relative_attention_max_distance": 32,
                  "feed_forward_proj": "gated-gelu", "dropout_rate": 0.0},
)
HEIGHT, WIDTH = 192, 192
CONFIGS = ("vidloom", "vidloom-recompute", "diffusers", "vidloom-full")


def _checkpoint() -> Path:
    folder = CACHE / MID.name
    if not (folder / "model_index.json").exists():
        write_tiny_far(folder, MID)
    return folder


# -- worker: one configuration and length, one process ---------------------------------------


def _run_vidloom(folder: Path, frames: int, steps: int, kv_cache: bool, full_run: bool) -> dict[str, float]:
    """Rollout only (text, noise, rollout: no decode), or (`full_run`) a whole generation for time to first chunk."""
    from vidloom.core.request import GenerationRequest
    from vidloom.generator import VideoGenerator
    from vidloom.recipes.wan_causal.loop import CHUNK_PHASE
    from vidloom.recipes.wan_causal.program import build_program
    from vidloom.runtime.engine import Engine

    instance = VideoGenerator.from_pretrained(folder, device="cpu").engine.instance
    full = build_program(instance, kv_cache=kv_cache)
    rollout = Engine(instance, build_program(instance, kv_cache=kv_cache, decode=False))

    def request(n_steps: int) -> GenerationRequest:
        return GenerationRequest(PROMPT, height=HEIGHT, width=WIDTH, num_frames=frames, num_inference_steps=n_steps,
                                 seed=SEED)

    if full_run:  # its own process, so its decode does not count in the rollout rows' peak RSS
        engine = Engine(instance, full)
        engine.run(request(1))
        first: list[float] = []
        start = time.perf_counter()
        engine.run(request(steps), on_event=lambda e: (
            not first and getattr(e, "phase", "") == CHUNK_PHASE and first.append(time.perf_counter() - start)))
        return {"wall_s": time.perf_counter() - start, "first_chunk_s": first[0]}
    rollout.run(request(1))  # warm-up
    start, cpu = time.perf_counter(), time.process_time()
    rollout.run(request(steps))
    return {"rollout_s": time.perf_counter() - start, "rollout_cpu_s": time.process_time() - cpu}


def _run_diffusers(folder: Path, frames: int, steps: int) -> dict[str, float]:
    import torch
    from diffusers import AnyFlowFARPipeline

    from vidloom.recipes.wan_causal.loop import chunk_partition

    pipe = AnyFlowFARPipeline.from_pretrained(str(folder), dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    partition = list(chunk_partition((frames - 1) // 4 + 1, tuple(pipe.transformer.config.chunk_partition)))

    def run(n_steps: int) -> None:  # latents out: the rollout alone, as vidloom's rollout_s
        pipe(prompt=PROMPT, height=HEIGHT, width=WIDTH, num_frames=frames, num_inference_steps=n_steps,
             chunk_partition=partition, generator=torch.Generator("cpu").manual_seed(SEED), output_type="latent",
             use_kv_cache=True)

    run(1)
    start, cpu = time.perf_counter(), time.process_time()
    run(steps)
    return {"rollout_s": time.perf_counter() - start, "rollout_cpu_s": time.process_time() - cpu}


def worker(config: str, frames: int, steps: int) -> None:
    import torch

    torch.manual_seed(0)
    folder = _checkpoint()
    if config == "diffusers":
        result = _run_diffusers(folder, frames, steps)
    else:
        result = _run_vidloom(folder, frames, steps, kv_cache=config != "vidloom-recompute",
                              full_run=config == "vidloom-full")
    result["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(result))


# -- driver ---------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frames", default="17,41,65")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--max-wait", type=float, default=120.0, help="seconds to wait for a quiet machine per run")
    parser.add_argument("--worker", nargs=3, metavar=("CONFIG", "FRAMES", "STEPS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker[0], int(args.worker[1]), int(args.worker[2]))
        return
    _checkpoint()
    rows: list[dict[str, Any]] = []
    for frames in (int(f) for f in args.frames.split(",")):
        for config in args.configs.split(","):
            busy = wait_for_quiet(args.max_wait)
            out = subprocess.run([sys.executable, __file__, "--worker", config, str(frames), str(args.steps)],
                                 capture_output=True, text=True, check=True)
            result = json.loads(out.stdout.strip().splitlines()[-1])
            rows.append({"config": config, "frames": frames, "busy_at_start": busy, **result})
            print(f"{config:>18} frames={frames:<3} {result}", file=sys.stderr)
    _report(rows, args.steps)


def _token_passes(frames: int, steps: int, kv_cache: bool) -> int:
    """Tokens pushed through the blocks by a rollout (the deterministic part of its cost).

    KV cache: one prefill of the context per chunk, then `steps` passes of the chunk alone;
    recompute: `steps` passes of context plus chunk. Attention adds a term growing with
    context x chunk on both paths (the chunk's queries see the whole context either way).
    """
    from vidloom.models.wan.transformer import WanTransformerConfig
    from vidloom.models.wan_causal.config import FarTransformerConfig
    from vidloom.models.wan_causal.layout import ChunkLayout
    from vidloom.recipes.wan_causal.loop import chunk_partition

    arch = {k: v for k, v in MID.transformer.items() if k in ("patch_size", "num_attention_heads", "attention_head_dim")}
    config = FarTransformerConfig(wan=WanTransformerConfig(**arch), compressed_patch_size=(1, 4, 4),
                                  full_chunk_limit=MID.transformer["full_chunk_limit"],
                                  chunk_partition=MID.transformer["chunk_partition"])
    partition = chunk_partition((frames - 1) // 4 + 1, config.chunk_partition)
    layouts = [ChunkLayout.for_chunk(partition, k, (HEIGHT // 8, WIDTH // 8), config) for k in range(len(partition))]
    if kv_cache:
        return sum(layout.context_tokens + steps * layout.generated_tokens for layout in layouts)
    return sum(steps * layout.total_tokens for layout in layouts)


def _report(rows: list[dict[str, Any]], steps: int) -> None:
    from vidloom.recipes.wan_causal.loop import chunk_partition

    by = {(r["config"], r["frames"]): r for r in rows}
    table, summary = [], []
    for frames in sorted({r["frames"] for r in rows}):
        chunks = len(chunk_partition((frames - 1) // 4 + 1, MID.transformer["chunk_partition"]))
        base = by.get(("vidloom", frames))
        entry = {"frames": frames, "chunks": chunks,
                 "token_passes_recompute_over_kv": round(
                     _token_passes(frames, steps, False) / _token_passes(frames, steps, True), 2)}
        for key, name in (("vidloom-recompute", "recompute_over_kv"), ("diffusers", "diffusers_over_vidloom")):
            if base and (key, frames) in by:
                entry[name] = round(by[(key, frames)]["rollout_s"] / base["rollout_s"], 2)
                if "rollout_cpu_s" in base and "rollout_cpu_s" in by[(key, frames)]:
                    # CPU time: less disturbed than wall time by other work on a shared machine.
                    entry[name + "_cpu"] = round(by[(key, frames)]["rollout_cpu_s"] / base["rollout_cpu_s"], 2)
                entry[name.replace("_over_", "_rss_over_")] = round(
                    by[(key, frames)]["peak_rss_mib"] / base["peak_rss_mib"], 2)
        full = by.get(("vidloom-full", frames))
        if full:
            entry["first_chunk_over_total"] = round(full["first_chunk_s"] / full["wall_s"], 3)
        summary.append(entry)
        for r in rows:
            if r["frames"] == frames:
                cells = [r.get(k) for k in ("rollout_s", "rollout_cpu_s", "wall_s", "first_chunk_s")]
                table.append([r["config"], frames, chunks, *("-" if c is None else f"{c:.2f}" for c in cells),
                              f"{r['peak_rss_mib']:.0f}"])
    print_table(["config", "frames", "chunks", "rollout s", "rollout CPU s", "full run s", "first chunk s",
                 "peak RSS MiB"], table)
    print(json.dumps(summary, indent=1))
    write_json("far_rollout.json", {
        "size": {"architecture": MID.transformer, "height": HEIGHT, "width": WIDTH, "steps": steps},
        "environment": environment(), "runs": rows, "summary": summary,
    })



if __name__ == "__main__":
    main()
