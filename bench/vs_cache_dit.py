"""diffusers + cache-dit vs vidloom's step caches at matching settings, side by side, per family.

Both systems run the same random-weight checkpoint (bench/cache_dit_families.py: Wan from bench/checkpoints.py, the
other families from bench/family_bench.py's mid checkpoints or the tests' tiny ones), prompt, seed and steps. For
each DBCache setting (Fn, Bn, TaylorSeer order) and threshold in the sweep, each system reports its wall time, its
speed-up against its **own** uncached run and the PSNR of its frames (Stable Audio: its waveform mapped to [0, 1],
family_bench.unit_audio) against its **own** uncached output, and how many steps it cached; vidloom's `quality` /
`balanced` / `fast` presets are swept too. Each system runs in its own process (one load, a warm-up, then the plain
run and every setting in turn); rounds alternate which system goes first, and the machine's load is recorded before
each. A setting one system cannot run is a row with its error.

Random weights do not behave like a trained model's: residuals change more from step to step, so the
thresholds that cache a given number of steps are larger than published ones, and PSNR against the uncached
output measures drift, not visual quality.

    python bench/vs_cache_dit.py [--families wan,flux2,qwen-image] [--size mid] [--rounds 2] [--thresholds 0.1,0.2,0.4]
    python bench/vs_cache_dit.py --smoke --families flux2   # tiny checkpoint, 4 steps, one setting: the wiring
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np

from cache_dit_families import FAMILY_NAMES, NOT_RUN, CacheTarget
from cache_dit_families import target as cache_target
from checkpoints import SIZES
from report import environment, print_table, psnr, wait_for_quiet, write_json

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


def _timed(generate: Callable[[], tuple[np.ndarray, dict[str, int]]]) -> tuple[np.ndarray, dict[str, Any]]:
    """Frames and {wall_s, what was cached}: cache-dit's cached steps of the cond (and uncond) branch; vidloom's steps
    every branch reused and the blocks it skipped (one branch reusing shows there, not in the steps)."""
    started = time.perf_counter()
    frames, cached = generate()
    return frames, {"wall_s": time.perf_counter() - started, **cached}


def _diffusers(target: CacheTarget, folder: Path, sweep: list[tuple[Setting, float]],
               presets: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    import cache_dit
    import diffusers
    import torch

    pipe = getattr(diffusers, target.bench.pipeline).from_pretrained(str(folder), dtype=torch.float32,
                                                                     **target.bench.load_kwargs)
    pipe.set_progress_bar_config(disable=True)

    def generate(n: int = target.steps, cached: bool = False) -> tuple[np.ndarray, dict[str, int]]:
        frames = target.call_reference(pipe, n)
        if not cached:
            return frames, {"cached_steps": 0}
        stats = cache_dit.summary(pipe, logging=False)[0]  # the first block list's; cfg_: the uncond branch's
        return frames, {"cached_steps": len(stats.cached_steps), "cfg_cached_steps": len(stats.cfg_cached_steps)}

    generate(target.bench.warmup_steps)
    plain_frames, plain_row = _plain(generate)
    rows = [plain_row]
    for setting, threshold in sweep:
        config = cache_dit.DBCacheConfig(Fn_compute_blocks=setting.fn, Bn_compute_blocks=setting.bn,
                                         residual_diff_threshold=threshold, max_warmup_steps=WARMUP)
        calibrator = (cache_dit.TaylorSeerCalibratorConfig(taylorseer_order=setting.taylorseer)
                      if setting.taylorseer else None)
        try:
            cache_dit.enable_cache(pipe, cache_config=config, calibrator_config=calibrator)
            frames, row = _timed(lambda: generate(cached=True))
        except Exception as error:  # one setting cache-dit cannot run is a row, not the end of the sweep
            rows.append({"config": setting.name, "threshold": threshold, "error": f"{type(error).__name__}: {error}"})
            continue
        finally:
            cache_dit.disable_cache(pipe)
        rows.append({"config": setting.name, "threshold": threshold, **row, "psnr_db": psnr(frames, plain_frames)})
    return rows


def _plain(generate: Callable[[], tuple[np.ndarray, dict[str, int]]]) -> tuple[np.ndarray, dict[str, Any]]:
    """The uncached output (kept for PSNR) and the faster of two timings (the first warms the allocator)."""
    _, first = _timed(generate)
    frames, second = _timed(generate)
    return frames, {**second, "config": "plain", "wall_s": min(first["wall_s"], second["wall_s"])}


def _vidloom(target: CacheTarget, folder: Path, sweep: list[tuple[Setting, float]],
             presets: tuple[str, ...] = PRESETS) -> list[dict[str, Any]]:
    from vidloom.core.deploy import DeployConfig
    from vidloom.generator import VideoGenerator

    loaded: dict[DeployConfig, Any] = {}

    def engine(deploy: DeployConfig) -> Any:
        if deploy not in loaded:
            loaded.clear()  # one model resident at a time
            loaded[deploy] = VideoGenerator.from_pretrained(folder, device="cpu", dtype=target.vidloom_dtype,
                                                            deploy=deploy).engine
        return loaded[deploy]

    def generate(deploy: DeployConfig, threshold: float | None = None,
                 n: int = target.steps) -> tuple[np.ndarray, dict[str, int]]:
        out = engine(deploy).run(target.vidloom_request(n, threshold))
        video = target.bench.vidloom_output(out)  # frames, or Stable Audio's waveform mapped as the reference's
        if video.dtype == np.uint8:  # frames converted on a CUDA device come back as uint8
            video = video.astype(np.float32) / 255.0
        report = out.get("step_cache", {})
        return video, {"cached_steps": report.get("skipped_steps", 0),
                       **{k: report[k] for k in ("skipped_blocks", "total_blocks") if k in report}}

    warmup = target.bench.warmup_steps
    plain_deploy = DeployConfig()
    generate(plain_deploy, n=warmup)
    plain_frames, plain_row = _plain(lambda: generate(plain_deploy))
    rows = [plain_row]
    runs = [(s.name, DeployConfig(step_cache="dbcache", step_cache_fn=s.fn, step_cache_bn=s.bn,
                                  step_cache_warmup=WARMUP, step_cache_taylorseer=s.taylorseer), t) for s, t in sweep]
    runs += [(p, DeployConfig(step_cache=p, step_cache_warmup=WARMUP), t) for p in presets for t in _thresholds(sweep)]
    for name, deploy, threshold in runs:
        try:
            generate(deploy, threshold, n=warmup)  # a new load's first run pays its allocations, as the plain one did
            frames, row = _timed(lambda: generate(deploy, threshold))
        except Exception as error:  # a setting vidloom refuses is a row, not the end of the sweep
            rows.append({"config": name, "threshold": threshold, "error": f"{type(error).__name__}: {error}"})
            continue
        rows.append({"config": name, "threshold": threshold, **row, "psnr_db": psnr(frames, plain_frames)})
    return rows


def _thresholds(sweep: list[tuple[Setting, float]]) -> list[float]:
    return sorted({t for _, t in sweep})


SYSTEM_RUNS: dict[str, Callable[..., list[dict[str, Any]]]] = {
    "diffusers+cache-dit": _diffusers, "vidloom": _vidloom}
"""Each system's whole sweep in this process, (target, folder, sweep, presets): the plain row first, then one row
per setting (or its error); presets are vidloom's only."""


def worker(system: str, family: str, size_name: str, steps: int, folder: str, sweep_json: str) -> None:
    target = replace(cache_target(family, size_name), steps=steps)
    payload = json.loads(sweep_json)
    sweep = [(Setting(**s), t) for s, t in payload["sweep"]]
    rows = SYSTEM_RUNS[system](target, Path(folder), sweep, tuple(payload["presets"]))
    plain = rows[0]["wall_s"]
    for row in rows:
        if "wall_s" in row:
            row["speedup_vs_own_plain"] = plain / row["wall_s"]
    print("RESULT " + json.dumps(rows))


# -- driver -----------------------------------------------------------------------------------------


SYSTEMS = tuple(SYSTEM_RUNS)


def _spawn(system: str, target: CacheTarget, size: str, sweep: list[tuple[Setting, float]],
           presets: tuple[str, ...]) -> list[dict[str, Any]]:
    payload = json.dumps({"sweep": [(vars(s), t) for s, t in sweep], "presets": presets})
    proc = subprocess.run([sys.executable, __file__, "--worker", system, target.family, size, str(target.steps),
                           str(target.checkpoint()), payload], capture_output=True, text=True, timeout=7200)
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


def cached(row: dict[str, Any]) -> str:
    """What a row cached: cache-dit's "cond+uncond" cached steps, vidloom's steps (and share of blocks skipped)."""
    if "cfg_cached_steps" in row:
        return f"{row['cached_steps']}+{row['cfg_cached_steps']}"
    if row.get("total_blocks"):
        return f"{row['cached_steps']} ({100 * row['skipped_blocks'] / row['total_blocks']:.0f}% blocks)"
    return str(row.get("cached_steps", "-"))


def _table_rows(table: dict[str, list[dict[str, Any]]]) -> list[list[Any]]:
    def db(row: dict[str, Any]) -> Any:
        if "psnr_db" not in row:
            return "-"
        return "inf" if row["psnr_db"] in (float("inf"), "inf") else round(row["psnr_db"], 1)

    return [[system, row["config"], row.get("threshold", "-"), cached(row), row.get("wall_s", "-"),
             row.get("speedup_vs_own_plain", "-"), db(row)]
            for system, system_rows in table.items() for row in system_rows]


def run_family(family: str, args: argparse.Namespace) -> dict[str, Any]:
    """Both systems on one family: the sweep in alternating order per round, merged, printed and returned."""
    thresholds = [float(t) for t in args.thresholds.split(",")]
    settings = tuple(s for s in SETTINGS if s.name in args.settings.split(",")) if args.settings else SETTINGS
    if args.smoke:
        args.size, args.steps, args.rounds, thresholds, settings = "tiny", 4, 1, [0.3], (Setting(1, 0, 1),)
    target = cache_target(family, args.size)
    if args.steps:
        target = replace(target, steps=args.steps)
    target.checkpoint()  # written once here, not timed
    # Fn + Bn must leave a middle block in this DiT (the same check vidloom makes at its first step).
    sweep = [(s, t) for s in settings if s.fn + s.bn < target.blocks() for t in thresholds]
    results: dict[str, list[list[dict[str, Any]]]] = {s: [] for s in SYSTEMS}
    busy: list[float] = []
    for r in range(args.rounds):
        for system in SYSTEMS if r % 2 == 0 else SYSTEMS[::-1]:
            busy.append(wait_for_quiet(args.quiet_wait))
            results[system].append(_spawn(system, target, args.size, sweep, args.preset_names))
            print(f"  [{family} round {r + 1}/{args.rounds}] {system} done", file=sys.stderr, flush=True)
    table = {system: _merge(rounds) for system, rounds in results.items()}
    print(f"\n{family} ({args.size}, {target.steps} steps)")
    print_table(["system", "config", "threshold", "cached", "wall s", "speed-up", "PSNR dB"], _table_rows(table))
    return {"environment": environment(), "family": family, "size": args.size, "steps": target.steps,
            "request": {**target.bench.request, "steps": target.steps}, "pipeline": target.bench.pipeline,
            "vidloom_dtype": target.vidloom_dtype or "vidloom's default", "diffusers_dtype": "float32",
            "warmup_steps": WARMUP, "rounds": args.rounds, "machine_busy_before": busy, "load_avg": os.getloadavg(),
            "systems": table}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", default="wan", help=f"comma-separated, of {', '.join(FAMILY_NAMES)}")
    parser.add_argument("--size", default="mid", choices=sorted(SIZES))
    parser.add_argument("--steps", type=int, default=None, help="denoise steps (default: the size's)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--thresholds", default="0.1,0.2,0.4")
    parser.add_argument("--settings", default="", help=f"a subset of {','.join(s.name for s in SETTINGS)} (default all)")
    parser.add_argument("--presets", default=",".join(PRESETS), help="vidloom's presets to sweep too ('' for none)")
    parser.add_argument("--smoke", action="store_true", help="tiny, 4 steps, F1B0+T1 at one threshold, 1 round")
    parser.add_argument("--quiet-wait", type=float, default=120.0,
                        help="seconds to wait for a quiet machine before each system's process")
    parser.add_argument("--what", default="", help="a note on how this run was measured, kept in the JSON")
    parser.add_argument("--out", type=Path, default=None, help="JSON folder (default bench/results)")
    parser.add_argument("--worker", nargs=6, help=argparse.SUPPRESS,
                        metavar=("SYSTEM", "FAMILY", "SIZE", "STEPS", "FOLDER", "SWEEP"))
    args = parser.parse_args(argv)
    if args.worker:
        system, family, size, steps, folder, sweep = args.worker
        worker(system, family, size, int(steps), folder, sweep)
        return 0
    unknown_settings = set(filter(None, args.settings.split(","))) - {s.name for s in SETTINGS}
    if unknown_settings:
        parser.error(f"--settings: {', '.join(sorted(unknown_settings))} not among {', '.join(s.name for s in SETTINGS)}")
    presets = tuple(filter(None, args.presets.split(",")))
    if set(presets) - set(PRESETS):
        parser.error(f"--presets: {', '.join(sorted(set(presets) - set(PRESETS)))} not among {', '.join(PRESETS)}")
    families = [f.strip() for f in args.families.split(",") if f.strip()]
    unknown = [f for f in families if f not in FAMILY_NAMES]
    if unknown:
        parser.error(f"--families: {', '.join(unknown)} not among {', '.join(FAMILY_NAMES)}"
                     + "".join(f"; {f}: {NOT_RUN[f]}" for f in unknown if f in NOT_RUN))
    for family in families:
        result = run_family(family, argparse.Namespace(**vars(args), preset_names=presets))
        if args.what:
            result["what"] = args.what
        size = "smoke" if args.smoke else args.size
        name = f"vs_cache_dit-{size}.json" if family == "wan" else f"vs_cache_dit-{family}-{size}.json"
        write_json(name, result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
