"""Several processes: step time and end-to-end time of 1 vs sp=2 / cfg=2 (/ sp=2 x cfg=2) processes.

Each plan gets a fresh pool, one warm-up request (1 step) and `--runs` timed requests; the
step time is the median of rank 0's denoise-step wall times (collectives included), end to
end the median of the parent's wall time for the whole request (text, denoise, decode, round trips, the
video coming back). The communication volume per step is computed from the shapes, per
rank, with the usual algorithmic counts (all-to-all: (P-1)/P of the local tensor leaves the
rank; all-gather: (P-1)/P of the gathered tensor arrives), and set against two reference
bandwidths to state the expected scaling.

On a 2-core CPU the single process already uses both cores (two intra-op threads), and the
ranks get one thread each, so little speed-up is possible there; "1t1" (one process, one
thread) is the per-rank compute budget to compare against. The scaling claim is for one
GPU per rank.

Each pool's ranks report their resident memory, read before the pool closes: the peak (`rank_peak_rss_mib`, VmHWM,
which includes loading the whole checkpoint before sharding) and after the runs (`rank_rss_after_mib`, VmRSS):
sp2 against sp2shard after the runs is what sharded weights save per rank while serving.

With `--vae-tile N` the decode is tiled (N-pixel tiles, the default 3/4 stride) and under a parallel plan the ranks
split its tiles (layers.tiling.shared_tiles); `decode_s` is rank 0's decode wall time.

    python bench/parallel.py [--size mid] [--steps 3] [--frames 9] [--plans 1,1t1,sp2,cfg2,sp2xcfg2] [--vae-tile 64]
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import statistics
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from checkpoints import SIZES, ensure_checkpoint
from report import environment, print_table, wait_for_quiet, write_json
from vidloom.core.deploy import DeployConfig
from vidloom.core.output import ProgressEvent
from vidloom.core.parallel import ParallelPlan, SequenceGeometry
from vidloom.core.request import GenerationRequest
from vidloom.generator import VideoGenerator
from vidloom.models.wan.transformer_config import WanTransformerConfig
from vidloom.families.wan.parallel import sequence_geometry

PLANS = {
    "1": ParallelPlan(), "1t1": ParallelPlan(), "sp2": ParallelPlan(sp=2), "cfg2": ParallelPlan(cfg=2),
    "sp2xcfg2": ParallelPlan(sp=2, cfg=2), "sp2shard": ParallelPlan(sp=2, shard_weights=True),
}
"""Plan names for --plans; "1t1" is one process limited to one thread, the per-rank budget of the CPU pools;
"sp2shard" is sp=2 with --shard-weights (each rank holds half of every block's weights)."""
# Reference link speeds for the expected-time column (per rank, one direction).
BANDWIDTHS_GBPS = {"loopback_gloo": 2.0, "nvlink_h100": 150.0}
# Analytic GPU estimate: H100/H200-class bf16 (~990 TFLOP/s dense peak, DiT steps reach ~40%)
# with NVLink all-to-all at ~150 GB/s per rank. Wan pads prompts to 512 text tokens.
GPU_TFLOPS, GPU_LINK_GBPS, TEXT_TOKENS = 400.0, 150.0, 512
QUIET_WAIT_S = 300.0
"""At most this long before each timed request, waiting for the CPU to go quiet (the GPU check sets less)."""
ANALYTIC_PLANS = {"sp2": ParallelPlan(sp=2), "sp4": ParallelPlan(sp=4), "cfg2": ParallelPlan(cfg=2),
                  "sp2xcfg2": ParallelPlan(sp=2, cfg=2)}


@dataclass(frozen=True)
class Traffic:
    """Bytes one rank sends or receives per denoise step, by collective."""

    all_to_all: int
    """Ulysses: q, k, v to head-sharded and the attention output back, every layer and forward."""
    all_gather_tokens: int
    """Sequence parallel: the token shards gathered before the output head, every forward."""
    all_gather_cfg: int
    """CFG parallel: the other branch's prediction (float32 latents), once per step."""

    @property
    def total(self) -> int:
        return self.all_to_all + self.all_gather_tokens + self.all_gather_cfg


def traffic(plan: ParallelPlan, dit: WanTransformerConfig, tokens: int, latent_elems: int, elem: int) -> Traffic:
    """Per-rank bytes per step for classic CFG (two branches) at batch 1."""
    p, dim = plan.sp, dit.inner_dim
    forwards = 2 // plan.cfg  # network calls per step on one rank
    local = tokens // p * dim  # this rank's tokens x channels
    # Per self-attention: q, k, v out and the result back, (P-1)/P of each local tensor leaves.
    a2a = 4 * local * (p - 1) // p * dit.num_layers * forwards if p > 1 else 0
    gather = tokens * dim * (p - 1) // p * forwards if p > 1 else 0  # before the head
    cfg = latent_elems if plan.cfg > 1 else 0  # the other branch's prediction (fp32)
    return Traffic(a2a * elem, gather * elem, cfg * 4)


def dit_flops(dit: WanTransformerConfig, tokens: int, forwards: int = 2) -> float:
    """Matmul FLOPs of one CFG step (two forwards): projections, FFN, self- and cross-attention."""
    d, f, text = dit.inner_dim, dit.ffn_dim, TEXT_TOKENS
    linear = 2 * tokens * (4 * d * d + 2 * d * d + 2 * d * f) + 2 * text * 2 * d * d  # q,k,v,o; cross q,o; FFN; cross k,v
    attention = 4 * tokens * tokens * d + 4 * tokens * text * d
    return float((linear + attention) * dit.num_layers * forwards)


def analytic(size: str, height: int, width: int, num_frames: int) -> dict[str, Any]:
    """Expected GPU step time and speed-up per plan: compute splits P ways, communication adds on top."""
    dit = WanTransformerConfig(**SIZES[size].spec.transformer)
    geometry = SequenceGeometry(dit.num_attention_heads, dit.patch_size, vae_spatial=8, vae_temporal=4)
    grid = geometry.patch_grid(height, width, num_frames)
    tokens, latent = math.prod(grid), dit.out_channels * math.prod(g * p for g, p in zip(grid, dit.patch_size))
    one = dit_flops(dit, tokens) / (GPU_TFLOPS * 1e12)
    plans = {}
    for name, plan in ANALYTIC_PLANS.items():
        if dit.num_attention_heads % plan.sp or tokens % plan.sp:
            continue
        comm = traffic(plan, dit, tokens, latent, 2).total / (GPU_LINK_GBPS * 1e9)
        step = one / plan.world_size + comm
        plans[name] = {"comm_s": round(comm, 4), "step_s": round(step, 4), "speedup": round(one / step, 2),
                       "comm_bytes_per_rank": traffic(plan, dit, tokens, latent, 2).total}
    return {"size": size, "request": f"{height}x{width}x{num_frames}", "tokens": tokens,
            "step_s_one_gpu": round(one, 4), "plans": plans}


def run_plan(name: str, checkpoint: Any, request: GenerationRequest, device: str, runs: int,
             vae_tile: int | None = None) -> dict[str, Any]:
    plan = PLANS[name]
    threads = torch.get_num_threads()
    if name == "1t1":
        torch.set_num_threads(1)
    try:
        return _timed(name, plan, checkpoint, request, device, runs, vae_tile)
    finally:
        torch.set_num_threads(threads)


STEP_PHASES = ("denoise", "stage1", "stage2", "rollout")
"""Progress phases whose events are denoise steps: LTX-2 names its stages, AnyFlow-FAR its causal rollout."""


def _timed(
    name: str, plan: ParallelPlan, checkpoint: Any, request: GenerationRequest, device: str, runs: int,
    vae_tile: int | None = None,
) -> dict[str, Any]:
    started = time.perf_counter()
    deploy = DeployConfig(vae_tile=vae_tile, devices=plan.world_size, parallel=plan)
    with VideoGenerator.from_pretrained(checkpoint, device=device, deploy=deploy) as gen:  # type: ignore[arg-type]
        ready = time.perf_counter() - started
        # Warm-up (first-call costs): two steps where the request has them (some schedules need two).
        gen.engine.run(dataclasses.replace(request, num_inference_steps=min(2, request.num_inference_steps)))
        steps, ends, busy, decodes = [], [], [], []
        for _ in range(runs):
            events: list[ProgressEvent] = []
            # Another job on the machine wrecks multi-threaded timings (OpenMP threads spin-wait).
            busy.append(wait_for_quiet(max_wait_s=QUIET_WAIT_S))
            t0 = time.perf_counter()
            out = gen.engine.run(request, on_event=lambda e: events.append(e) if isinstance(e, ProgressEvent) else None)
            ends.append(time.perf_counter() - t0)
            steps += [e.seconds for e in events if e.phase in STEP_PHASES]
            decodes.append(sum(e.seconds for e in events if e.phase == "decode"))
        # One process: this one's (its peak includes what ran in it before, so run that plan first).
        pids = getattr(gen.engine, "transport", None) and gen.engine.transport.pids or [os.getpid()]
        peaks = [_rss_mib(pid, "VmHWM") for pid in pids] if pids else None
        held = [_rss_mib(pid, "VmRSS") for pid in pids] if pids else None
    return {
        "plan": name, "processes": plan.world_size, "startup_s": round(ready, 2),
        "step_s_median": round(statistics.median(steps), 4), "step_s_all": [round(s, 4) for s in steps],
        "end_to_end_s": round(statistics.median(ends), 3), "decode_s": round(statistics.median(decodes), 3),
        "busy_before": busy, "rank_peak_rss_mib": peaks, "rank_rss_after_mib": held,
        "video": out["video"] if "video" in out else out["audio"],
    }


def _rss_mib(pid: int, field: str) -> float | None:
    """A live process's resident set, MiB: its peak (VmHWM) or now (VmRSS), Linux; None where /proc does not say."""
    try:
        with open(f"/proc/{pid}/status") as status:
            line = next(line for line in status if line.startswith(f"{field}:"))
    except (OSError, StopIteration):
        return None
    return round(int(line.split()[1]) / 1024, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="mid", choices=sorted(SIZES))
    parser.add_argument("--steps", type=int, default=None, help="denoise steps (default: the size's)")
    parser.add_argument("--frames", type=int, default=None, help="frames, 4k+1 (default: the size's)")
    parser.add_argument("--plans", default="1,1t1,sp2,cfg2,sp2xcfg2", help=f"of {', '.join(PLANS)}")
    parser.add_argument("--runs", type=int, default=2, help="timed requests per plan (medians over all)")
    parser.add_argument("--vae-tile", type=int, default=None, help="tiled decode (pixels); ranks split the tiles")
    parser.add_argument("--json", default=None, help="results file name under bench/results (default: parallel.json, "
                                                     "or parallel-vae<N>.json with --vae-tile)")
    args = parser.parse_args()
    size = SIZES[args.size]
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    checkpoint = ensure_checkpoint(args.size)
    request = GenerationRequest(
        prompt="a lighthouse on a cliff at dusk", height=size.height, width=size.width,
        num_frames=args.frames or size.num_frames, num_inference_steps=args.steps or size.steps,
        guidance_scale=5.0, seed=0,
    )
    geometry: SequenceGeometry = sequence_geometry(checkpoint)
    dit = WanTransformerConfig(**size.spec.transformer)
    grid = geometry.patch_grid(request.height, request.width, request.num_frames)
    tokens = math.prod(grid)
    latent_elems = dit.out_channels * math.prod(g * p for g, p in zip(grid, geometry.patch_size))
    elem = 2 if cuda else 4  # bf16 on CUDA (card precision), fp32 on CPU

    results, reference = [], None
    for name in args.plans.split(","):
        plan = PLANS[name]
        if cuda and torch.cuda.device_count() < plan.world_size:
            print(f"skip {name}: needs {plan.world_size} GPUs")
            continue
        result = run_plan(name, checkpoint, request, device, args.runs, args.vae_tile)
        video = result.pop("video").astype(np.float64)  # uint8 on CUDA, float on CPU: never wrap around
        reference = video if reference is None else reference
        volume = traffic(plan, dit, tokens, latent_elems, elem)
        result["max_abs_diff_vs_first"] = float(np.abs(video - reference).max())
        result["comm_bytes_per_step_per_rank"] = volume.__dict__ | {"total": volume.total}
        result["expected_comm_s_per_step"] = {k: round(volume.total / (gbps * 1e9), 5) for k, gbps in BANDWIDTHS_GBPS.items()}
        results.append(result)
        print(f"{name}: step {result['step_s_median']:.3f} s, decode {result['decode_s']:.2f} s, end to end "
              f"{result['end_to_end_s']:.2f} s", flush=True)

    base = results[0]["step_s_median"] if results else 1.0
    rows = [[r["plan"], r["processes"], f"{r['step_s_median']:.3f}", f"{base / r['step_s_median']:.2f}x",
             f"{r['end_to_end_s']:.2f}", f"{r['comm_bytes_per_step_per_rank']['total'] / 2**20:.1f}",
             f"{r['expected_comm_s_per_step']['loopback_gloo'] * 1e3:.1f}", f"{r['max_abs_diff_vs_first']:.1e}",
             "-" if not r["rank_peak_rss_mib"] else f"{max(r['rank_peak_rss_mib']):.0f}",
             "-" if not r["rank_rss_after_mib"] else f"{max(r['rank_rss_after_mib']):.0f}"]
            for r in results]
    print_table(["plan", "procs", "step s", "speedup", "e2e s", "comm MiB/step/rank", "comm ms @2GB/s", "max |diff|",
                 "peak RSS MiB/rank", "RSS after MiB/rank"], rows)
    default_json = "parallel.json" if args.vae_tile is None else f"parallel-vae{args.vae_tile}.json"
    write_json(args.json or default_json, {
        "benchmark": "parallel", "size": args.size, "device": device, "environment": environment(),
        "request": {"height": request.height, "width": request.width, "num_frames": request.num_frames,
                    "steps": request.num_inference_steps, "guidance_scale": request.guidance_scale},
        "vae_tile": args.vae_tile, "tokens": tokens, "patch_grid": grid, "heads": geometry.num_heads,
        "layers": dit.num_layers,
        "bandwidths_gbps": BANDWIDTHS_GBPS, "results": results,
        "expected_gpu": [analytic(args.size, request.height, request.width, request.num_frames),
                         analytic("real-1.3b", 480, 832, 81)],
        "expected_gpu_assumptions": {"tflops": GPU_TFLOPS, "link_gbps": GPU_LINK_GBPS, "text_tokens": TEXT_TOKENS},
    })
    for estimate in (analytic("real-1.3b", 480, 832, 81),):
        print(f"expected on GPUs, {estimate['size']} {estimate['request']} ({estimate['tokens']} tokens): "
              + ", ".join(f"{k} {v['speedup']}x (comm {v['comm_s'] * 1e3:.0f} ms)" for k, v in estimate["plans"].items()))


if __name__ == "__main__":
    main()
