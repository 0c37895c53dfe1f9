"""AnyFlow-FAR rollout: KV cache vs recompute by chunk count, time to first chunk, vidloom vs diffusers.

All on one random-weight checkpoint written by diffusers (MID below), one JSON
(bench/results/far_rollout.json), three measurements:

- cache sweep: one process times the rollout (text, noise, every chunk; no VAE decode)
  with the KV cache and with recompute-from-scratch at several chunk counts, the two
  alternating, best of --repeats each. Recompute re-runs the whole prefix at every step,
  so the cache should win by a factor growing with the chunk count (towards the step
  count); the token-pass model next to it is that expectation without timing noise.
  Wall and CPU time both: with one torch thread CPU time is the work itself, while wall
  time also counts the waits for a core that other processes hold.
- vs diffusers: --rounds fresh processes per engine (comparable peak RSS; the order
  alternates), each loads, warms up on a 1-step request, then times the rollout alone
  (latents out) and a whole generation (frames out) of the same request; ratios
  diffusers / vidloom of each engine's best run, for wall time and peak RSS.
- first chunk: in vidloom's whole generation above, the time to the first decoded chunk
  (its ChunkEvent) against the total of that same request. diffusers returns frames only
  at the end, so its time to first frame is its total.

Threads: --threads (default 1). The machine this was written on has 2 cores shared with
other work; with 2 torch threads a busy neighbour makes ours spin-wait and single runs
vary by up to 5x, with 1 the same run repeats within ~10-15%. Each row records the load
average (and each process the busy fraction) when it started. --parts runs some parts and
keeps the others' results in the JSON; each part records its own environment.

    python bench/far_rollout.py [--chunks 2,4,8] [--steps 4] [--frames 29] [--rounds 2] [--parts sweep,engines]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from checkpoints import cached  # noqa: E402
from report import RESULTS, environment, print_table, wait_for_quiet, write_json  # noqa: E402
from tests.helpers.far_checkpoints import TinyFar, write_tiny_far  # noqa: E402

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
SWEEP_SIZE = 128  # the cache sweep's frames are small so its longest rollout stays well under a minute
ENGINE_SIZE = 160
ENGINES = ("vidloom", "diffusers")


def _checkpoint() -> Path:
    return cached(MID.name, lambda folder: write_tiny_far(folder, MID))


def frames_for_chunks(chunks: int) -> int:
    """Video frames whose latent frames split into `chunks` chunks of MID's rhythm (1, then 3s)."""
    return 4 * 3 * (chunks - 1) + 1


def _load(threads: int) -> Any:
    import torch

    from vidloom.generator import VideoGenerator

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    return VideoGenerator.from_pretrained(_checkpoint(), device="cpu").engine.instance


def _request(size: int, frames: int, steps: int) -> Any:
    from vidloom.core.request import GenerationRequest

    return GenerationRequest(PROMPT, height=size, width=size, num_frames=frames, num_inference_steps=steps, seed=SEED)


# -- cache sweep: one process ----------------------------------------------------------------


def sweep(chunk_counts: list[int], steps: int, repeats: int, threads: int) -> list[dict[str, Any]]:
    """Best rollout wall time with the KV cache and with recompute, per chunk count, runs alternating."""
    from vidloom.families.wan_causal.program import build_program
    from vidloom.runtime.engine import Engine

    instance = _load(threads)
    engines = {kv: Engine(instance, build_program(instance, kv_cache=kv, decode=False)) for kv in (True, False)}
    for engine in engines.values():
        engine.run(_request(SWEEP_SIZE, frames_for_chunks(2), 1))  # warm-up
    rows = []
    for chunks in chunk_counts:
        frames = frames_for_chunks(chunks)
        wall = {True: float("inf"), False: float("inf")}
        cpu = dict(wall)
        load = os.getloadavg()[0]
        for _ in range(repeats):
            for kv, engine in engines.items():
                started = _clock()
                engine.run(_request(SWEEP_SIZE, frames, steps))
                wall_s, cpu_s = _since(started)
                wall[kv], cpu[kv] = min(wall[kv], wall_s), min(cpu[kv], cpu_s)
        passes = _token_passes(frames, steps, False) / _token_passes(frames, steps, True)
        rows.append({
            "chunks": chunks, "frames": frames,
            "kv_cache_s": round(wall[True], 3), "recompute_s": round(wall[False], 3),
            "kv_cache_cpu_s": round(cpu[True], 3), "recompute_cpu_s": round(cpu[False], 3),
            "recompute_over_kv": round(wall[False] / wall[True], 2),
            "recompute_over_kv_cpu": round(cpu[False] / cpu[True], 2),
            "token_passes_recompute_over_kv": round(passes, 2), "loadavg_1m_at_start": round(load, 2),
        })
        print(f"sweep {rows[-1]}", file=sys.stderr, flush=True)
    return rows


def _clock() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def _since(started: tuple[float, float]) -> tuple[float, float]:
    """(wall, CPU) seconds since `started`."""
    wall, cpu = _clock()
    return wall - started[0], cpu - started[1]


def _token_passes(frames: int, steps: int, kv_cache: bool) -> int:
    """Tokens pushed through the blocks by a rollout (the deterministic part of its cost).

    KV cache: one prefill of the context per chunk, then `steps` passes of the chunk alone;
    recompute: `steps` passes of context plus chunk. Attention adds a term growing with
    context x chunk on both paths (the chunk's queries see the whole context either way).
    """
    from vidloom.families.wan_causal.config import FarTransformerConfig
    from vidloom.families.wan_causal.layout import ChunkLayout
    from vidloom.families.wan_causal.loop import chunk_partition

    config = FarTransformerConfig.from_diffusers(MID.transformer)
    partition = chunk_partition((frames - 1) // 4 + 1, config.chunk_partition)
    latent = (SWEEP_SIZE // 8, SWEEP_SIZE // 8)
    layouts = [ChunkLayout.for_chunk(partition, k, latent, config) for k in range(len(partition))]
    if kv_cache:
        return sum(layout.context_tokens + steps * layout.generated_tokens for layout in layouts)
    return sum(steps * layout.total_tokens for layout in layouts)


# -- vs diffusers: one process per engine --------------------------------------------------------


def _engine_vidloom(frames: int, steps: int, threads: int) -> dict[str, float]:
    from vidloom.core.output import ChunkEvent
    from vidloom.families.wan_causal.program import build_program
    from vidloom.runtime.engine import Engine

    instance = _load(threads)
    rollout = Engine(instance, build_program(instance, decode=False))
    full = Engine(instance, build_program(instance))
    full.run(_request(ENGINE_SIZE, 5, 1))  # warm-up, decode included
    started = _clock()
    rollout.run(_request(ENGINE_SIZE, frames, steps))
    rollout_s, rollout_cpu_s = _since(started)
    first: list[tuple[float, float]] = []

    def on_event(event: Any) -> None:
        if isinstance(event, ChunkEvent) and not first:
            first.append(_since(started))

    started = _clock()
    full.run(_request(ENGINE_SIZE, frames, steps), on_event=on_event)
    full_s, full_cpu_s = _since(started)
    return {"rollout_s": rollout_s, "full_s": full_s, "first_chunk_s": first[0][0],
            "rollout_cpu_s": rollout_cpu_s, "full_cpu_s": full_cpu_s, "first_chunk_cpu_s": first[0][1]}


def _engine_diffusers(frames: int, steps: int, threads: int) -> dict[str, float]:
    import torch
    from diffusers import AnyFlowFARPipeline

    from vidloom.families.wan_causal.loop import chunk_partition

    torch.set_num_threads(threads)
    pipe = AnyFlowFARPipeline.from_pretrained(str(_checkpoint()), dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)

    def run(n_frames: int, n_steps: int, output_type: str) -> None:
        # The partition vidloom derives for this length (the pipeline needs it spelled out).
        partition = list(chunk_partition((n_frames - 1) // 4 + 1, tuple(pipe.transformer.config.chunk_partition)))
        pipe(prompt=PROMPT, height=ENGINE_SIZE, width=ENGINE_SIZE, num_frames=n_frames, num_inference_steps=n_steps,
             chunk_partition=partition, generator=torch.Generator("cpu").manual_seed(SEED), output_type=output_type,
             use_kv_cache=True)

    run(5, 1, "np")  # warm-up, decode included
    started = _clock()
    run(frames, steps, "latent")
    rollout_s, rollout_cpu_s = _since(started)
    started = _clock()
    run(frames, steps, "np")
    full_s, full_cpu_s = _since(started)
    return {"rollout_s": rollout_s, "full_s": full_s, "first_chunk_s": full_s,
            "rollout_cpu_s": rollout_cpu_s, "full_cpu_s": full_cpu_s, "first_chunk_cpu_s": full_cpu_s}


def engine_worker(engine: str, frames: int, steps: int, threads: int) -> None:
    run = _engine_diffusers if engine == "diffusers" else _engine_vidloom
    result = run(frames, steps, threads)
    result["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    print(json.dumps(result))


def engines(frames: int, steps: int, threads: int, rounds: int, max_wait: float) -> dict[str, Any]:
    """`rounds` processes per engine, the order alternating; each engine's best run is compared."""
    runs = []
    for round_ in range(rounds):
        for engine in ENGINES if round_ % 2 == 0 else ENGINES[::-1]:
            busy = wait_for_quiet(max_wait)
            load = os.getloadavg()[0]
            out = subprocess.run(
                [sys.executable, __file__, "--worker", engine, str(frames), str(steps), "--threads", str(threads)],
                capture_output=True, text=True, check=True,
            )
            result = {k: round(v, 3) for k, v in json.loads(out.stdout.strip().splitlines()[-1]).items()}
            runs.append({"engine": engine, "busy_at_start": busy, "loadavg_1m_at_start": round(load, 2), **result})
            print(f"engine {runs[-1]}", file=sys.stderr, flush=True)
    return {"frames": frames, "chunks": _chunks(frames), "runs": runs, **summarize(runs)}


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each engine's best of every measure, their ratios, and first chunk over total per vidloom run."""
    keys = ("rollout_s", "full_s", "first_chunk_s", "rollout_cpu_s", "full_cpu_s", "first_chunk_cpu_s", "peak_rss_mib")
    best = {engine: {k: min(r[k] for r in runs if r["engine"] == engine) for k in keys} for engine in ENGINES}
    ratios: dict[str, Any] = {f"diffusers_over_vidloom_{k}": round(best["diffusers"][k] / best["vidloom"][k], 2)
                              for k in keys}
    # Time to first chunk against the total of the same request: per run, never mixed across runs.
    ours = [r for r in runs if r["engine"] == "vidloom"]
    ratios["vidloom_first_chunk_over_total"] = [round(r["first_chunk_s"] / r["full_s"], 3) for r in ours]
    ratios["vidloom_first_chunk_over_total_cpu"] = [round(r["first_chunk_cpu_s"] / r["full_cpu_s"], 3) for r in ours]
    return {"best": best, "ratios": ratios}


def _chunks(frames: int) -> int:
    from vidloom.families.wan_causal.loop import chunk_partition

    return len(chunk_partition((frames - 1) // 4 + 1, MID.transformer["chunk_partition"]))


# -- driver ---------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunks", default="2,4,8", help="chunk counts of the cache sweep")
    parser.add_argument("--steps", type=int, default=4, help="flow-map steps per chunk (the release's default)")
    parser.add_argument("--frames", type=int, default=29, help="video frames of the vs-diffusers request")
    parser.add_argument("--repeats", type=int, default=2, help="sweep runs per path and chunk count (best kept)")
    parser.add_argument("--rounds", type=int, default=2, help="processes per engine in the vs-diffusers part")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--parts", default="sweep,engines", help="run only some parts; the others' results are kept")
    parser.add_argument("--max-wait", type=float, default=20.0, help="seconds to wait for a quiet machine per process")
    parser.add_argument("--worker", nargs=3, metavar=("ENGINE", "FRAMES", "STEPS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        engine_worker(args.worker[0], int(args.worker[1]), int(args.worker[2]), args.threads)
        return
    _checkpoint()
    parts = args.parts.split(",")
    previous = RESULTS / "far_rollout.json"
    payload: dict[str, Any] = json.loads(previous.read_text()) if previous.exists() else {}
    payload = {key: payload[key] for key in ("cache_sweep", "vs_diffusers") if key in payload}  # the parts only
    payload["checkpoint"] = {"architecture": MID.transformer, "vae": MID.vae}
    settings = {"steps": args.steps, "threads": args.threads}
    if "sweep" in parts:
        started = time.perf_counter()
        wait_for_quiet(args.max_wait)
        rows = sweep([int(c) for c in args.chunks.split(",")], args.steps, args.repeats, args.threads)
        payload["cache_sweep"] = {"settings": {**settings, "size": SWEEP_SIZE, "repeats": args.repeats},
                                  "environment": environment(), "rows": rows,
                                  "wall_s": round(time.perf_counter() - started, 1)}
    if "engines" in parts:
        started = time.perf_counter()
        block = engines(args.frames, args.steps, args.threads, args.rounds, args.max_wait)
        payload["vs_diffusers"] = {"settings": {**settings, "size": ENGINE_SIZE, "rounds": args.rounds},
                                   "environment": environment(), **block,
                                   "wall_s": round(time.perf_counter() - started, 1)}
    _print(payload)
    write_json("far_rollout.json", payload)


def _print(payload: dict[str, Any]) -> None:
    if "cache_sweep" in payload:
        print_table(["chunks", "frames", "KV cache s (CPU)", "recompute s (CPU)", "recompute/KV (CPU)",
                     "token passes ratio"],
                    [[r["chunks"], r["frames"], f"{r['kv_cache_s']:.2f} ({r['kv_cache_cpu_s']:.2f})",
                      f"{r['recompute_s']:.2f} ({r['recompute_cpu_s']:.2f})",
                      f"{r['recompute_over_kv']:.2f} ({r['recompute_over_kv_cpu']:.2f})",
                      f"{r['token_passes_recompute_over_kv']:.2f}"] for r in payload["cache_sweep"]["rows"]])
    if "vs_diffusers" in payload:
        block = payload["vs_diffusers"]
        print_table(["engine", "rollout s (CPU)", "full s (CPU)", "first chunk s (CPU)", "peak RSS MiB"],
                    [[r["engine"], f"{r['rollout_s']:.2f} ({r['rollout_cpu_s']:.2f})",
                      f"{r['full_s']:.2f} ({r['full_cpu_s']:.2f})",
                      f"{r['first_chunk_s']:.2f} ({r['first_chunk_cpu_s']:.2f})", f"{r['peak_rss_mib']:.0f}"]
                     for r in block["runs"]])
        print(json.dumps(block["ratios"], indent=1))

if __name__ == "__main__":
    main()
