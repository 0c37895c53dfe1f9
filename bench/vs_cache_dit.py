"""diffusers + cache-dit vs vidloom's step caches at matching settings, side by side (Wan first).

Both systems run the same random-weight checkpoint (bench/checkpoints.py), prompt, seed and steps. For each
DBCache setting (Fn, Bn, TaylorSeer order) and threshold in the sweep, each system reports its wall time,
its speed-up against its **own** uncached run and the PSNR of its frames against its **own** uncached
output, and how many steps it cached; vidloom's `quality` / `balanced` / `fast` presets are swept too.
Each system runs in its own process (one load, a 1-step warm-up, then the plain run and every setting in
turn); rounds alternate which system goes first, and the machine's load is recorded before each.

Random weights do not behave like a trained model's: residuals change more from step to step, so the
thresholds that cache a given number of steps are larger than published ones, and PSNR against the uncached
output measures drift, not visual quality.

    python bench/vs_cache_dit.py [--size mid] [--rounds 2] [--thresholds 0.1,0.2,0.4]
    python bench/vs_cache_dit.py --smoke          # tiny checkpoint, 4 steps, one setting: checks the wiring
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from checkpoints import SIZES, ensure_checkpoint
from report import environment, print_table, psnr, wait_for_quiet, write_json

PROMPT = "a red fox jumps over a frozen river"
NEGATIVE = "blurry, low quality"
SEED = 42
GUIDANCE = 5.0
WARMUP = 1  # steps each branch computes first, on both sides (cache-dit's max_warmup_steps)


@dataclass(frozen=True)
class Setting:
    """One DBCache configuration both systems run (cache-dit's Fn_compute_blocks, Bn_compute_blocks, order)."""

    fn: int
    bn: int
    taylorseer: int = 0

    @property
    def name(self) -> str:
        return f"F{self.fn}B{self.bn}" + (f"+T{self.taylorseer}" if self.taylorseer else "")


SETTINGS = (Setting(1, 0), Setting(1, 0, 1), Setting(4, 1), Setting(4, 1, 2), Setting(8, 1))
PRESETS = ("quality", "balanced", "fast")  # vidloom only: calibration-free, no cache-dit counterpart


# -- worker: one system, one process ----------------------------------------------------------------


def _timed(generate: Callable[[], tuple[np.ndarray, int]]) -> tuple[np.ndarray, dict[str, Any]]:
    started = time.perf_counter()
    frames, cached = generate()
    return frames, {"wall_s": time.perf_counter() - started, "cached_steps": cached}


def _diffusers(folder: Path, size: Any, steps: int, sweep: list[tuple[Setting, float]]) -> list[dict[str, Any]]:
    import cache_dit
    import torch
    from diffusers import WanPipeline

    pipe = WanPipeline.from_pretrained(str(folder), dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)

    def generate(n: int = steps, cached: bool = False) -> tuple[np.ndarray, int]:
        frames = pipe(prompt=PROMPT, negative_prompt=NEGATIVE, height=size.height, width=size.width,
                      num_frames=size.num_frames, num_inference_steps=n, guidance_scale=GUIDANCE,
                      generator=torch.Generator("cpu").manual_seed(SEED), output_type="np").frames[0]
        return frames, len(cache_dit.summary(pipe, logging=False)[0].cached_steps) if cached else 0

    generate(1)
    plain_frames, plain_row = _plain(generate)
    rows = [plain_row]
    for setting, threshold in sweep:
        config = cache_dit.DBCacheConfig(Fn_compute_blocks=setting.fn, Bn_compute_blocks=setting.bn,
                                         residual_diff_threshold=threshold, max_warmup_steps=WARMUP)
        calibrator = (cache_dit.TaylorSeerCalibratorConfig(taylorseer_order=setting.taylorseer)
                      if setting.taylorseer else None)
        cache_dit.enable_cache(pipe, cache_config=config, calibrator_config=calibrator)
        frames, row = _timed(lambda: generate(cached=True))
        cache_dit.disable_cache(pipe)
        rows.append({"config": setting.name, "threshold": threshold, **row, "psnr_db": psnr(frames, plain_frames)})
    return rows


def _plain(generate: Callable[[], tuple[np.ndarray, int]]) -> tuple[np.ndarray, dict[str, Any]]:
    """The uncached output (kept for PSNR) and the faster of two timings (the first warms the allocator)."""
    _, first = _timed(generate)
    frames, second = _timed(generate)
    return frames, {"config": "plain", "wall_s": min(first["wall_s"], second["wall_s"]), "cached_steps": 0}


def _vidloom(folder: Path, size: Any, steps: int, sweep: list[tuple[Setting, float]]) -> list[dict[str, Any]]:
    from vidloom.core.deploy import DeployConfig
    from vidloom.core.request import GenerationRequest
    from vidloom.generator import VideoGenerator

    loaded: dict[DeployConfig, Any] = {}

    def engine(deploy: DeployConfig) -> Any:
        if deploy not in loaded:
            loaded.clear()  # one model resident at a time
            loaded[deploy] = VideoGenerator.from_pretrained(folder, device="cpu", deploy=deploy).engine
        return loaded[deploy]

    def generate(deploy: DeployConfig, threshold: float | None = None, n: int = steps) -> tuple[np.ndarray, int]:
        out = engine(deploy).run(GenerationRequest(
            PROMPT, negative_prompt=NEGATIVE, height=size.height, width=size.width, num_frames=size.num_frames,
            num_inference_steps=n, guidance_scale=GUIDANCE, seed=SEED, step_cache_threshold=threshold))
        video = out["video"]
        if video.dtype == np.uint8:  # frames converted on a CUDA device come back as uint8
            video = video.astype(np.float32) / 255.0
        return video, out.get("step_cache", {}).get("skipped_steps", 0)

    plain_deploy = DeployConfig()
    generate(plain_deploy, n=1)
    plain_frames, plain_row = _plain(lambda: generate(plain_deploy))
    rows = [plain_row]
    runs = [(s.name, DeployConfig(step_cache="dbcache", step_cache_fn=s.fn, step_cache_bn=s.bn,
                                  step_cache_warmup=WARMUP, step_cache_taylorseer=s.taylorseer), t) for s, t in sweep]
    runs += [(p, DeployConfig(step_cache=p, step_cache_warmup=WARMUP), t) for p in PRESETS for t in _thresholds(sweep)]
    for name, deploy, threshold in runs:
        generate(deploy, threshold, n=1)  # a new load's first run pays its allocations, as the plain one did
        frames, row = _timed(lambda: generate(deploy, threshold))
        rows.append({"config": name, "threshold": threshold, **row, "psnr_db": psnr(frames, plain_frames)})
    return rows


def _thresholds(sweep: list[tuple[Setting, float]]) -> list[float]:
    return sorted({t for _, t in sweep})


def worker(system: str, size_name: str, steps: int, sweep_json: str) -> None:
    size = SIZES[size_name]
    sweep = [(Setting(**s), t) for s, t in json.loads(sweep_json)]
    run = _diffusers if system == "diffusers+cache-dit" else _vidloom
    rows = run(ensure_checkpoint(size_name), size, steps, sweep)
    plain = rows[0]["wall_s"]
    for row in rows:
        row["speedup_vs_own_plain"] = plain / row["wall_s"]
    print("RESULT " + json.dumps(rows))


# -- driver -----------------------------------------------------------------------------------------


SYSTEMS = ("diffusers+cache-dit", "vidloom")


def _spawn(system: str, size: str, steps: int, sweep: list[tuple[Setting, float]]) -> list[dict[str, Any]]:
    payload = json.dumps([(vars(s), t) for s, t in sweep])
    proc = subprocess.run([sys.executable, __file__, "--worker", system, size, str(steps), payload],
                          capture_output=True, text=True, timeout=7200)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        return [{"config": "error", "error": (proc.stderr or proc.stdout).strip().splitlines()[-3:]}]
    return json.loads(lines[-1].removeprefix("RESULT "))


def _merge(rounds: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Median wall time and speed-up per (config, threshold) over the rounds; decisions and PSNR are per run
    identical (same seed and settings), so the last run's are kept."""
    merged: dict[tuple[str, Any], list[dict[str, Any]]] = {}
    for rows in rounds:
        for row in rows:
            merged.setdefault((row["config"], row.get("threshold")), []).append(row)
    out = []
    for runs in merged.values():
        row = dict(runs[-1])
        if "wall_s" in row:
            row["wall_s"] = round(statistics.median(r["wall_s"] for r in runs), 3)
            row["speedup_vs_own_plain"] = round(statistics.median(r["speedup_vs_own_plain"] for r in runs), 3)
            row["wall_s_all"] = [round(r["wall_s"], 3) for r in runs]
        out.append(row)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="mid", choices=sorted(SIZES))
    parser.add_argument("--steps", type=int, default=None, help="denoise steps (default: the size's)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--thresholds", default="0.1,0.2,0.4")
    parser.add_argument("--smoke", action="store_true", help="tiny, 4 steps, F1B0+T1 at one threshold, 1 round")
    parser.add_argument("--worker", nargs=4, metavar=("SYSTEM", "SIZE", "STEPS", "SWEEP"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        system, size, steps, sweep = args.worker
        worker(system, size, int(steps), sweep)
        return 0
    thresholds = [float(t) for t in args.thresholds.split(",")]
    settings = SETTINGS
    if args.smoke:
        args.size, args.steps, args.rounds, thresholds, settings = "tiny", 4, 1, [0.3], (Setting(1, 0, 1),)
    size = SIZES[args.size]
    steps = args.steps or size.steps
    # Fn + Bn must leave a middle block in this size's DiT (the same check vidloom makes at its first step).
    layers = size.spec.transformer["num_layers"]
    sweep = [(s, t) for s in settings if s.fn + s.bn < layers for t in thresholds]
    ensure_checkpoint(args.size)  # written once here, not timed
    results: dict[str, list[list[dict[str, Any]]]] = {s: [] for s in SYSTEMS}
    busy: list[float] = []
    for r in range(args.rounds):
        for system in SYSTEMS if r % 2 == 0 else SYSTEMS[::-1]:
            busy.append(wait_for_quiet())
            results[system].append(_spawn(system, args.size, steps, sweep))
            print(f"  [round {r + 1}/{args.rounds}] {system} done", file=sys.stderr, flush=True)
    table = {system: _merge(rounds) for system, rounds in results.items()}
    rows = [[system, row["config"], row.get("threshold", "-"), row.get("cached_steps", "-"), row.get("wall_s", "-"),
             row.get("speedup_vs_own_plain", "-"), "inf" if row.get("psnr_db") == float("inf") else
             (round(row["psnr_db"], 1) if "psnr_db" in row else "-")]
            for system, system_rows in table.items() for row in system_rows]
    print_table(["system", "config", "threshold", "cached steps", "wall s", "speed-up", "PSNR dB"], rows)
    name = "vs_cache_dit-smoke.json" if args.smoke else f"vs_cache_dit-{args.size}.json"
    write_json(name, {"environment": environment(), "size": args.size, "steps": steps, "warmup_steps": WARMUP,
                      "rounds": args.rounds, "machine_busy_before": busy, "load_avg": os.getloadavg(),
                      "systems": table})
    return 0


if __name__ == "__main__":
    sys.exit(main())
