"""vidloom vs diffusers (and diffusers + cache-dit) on the same checkpoint, prompt, seed, size and steps.

Each (configuration, run) is a fresh subprocess, so peak RSS is comparable and no
run warms another's caches; runs alternate their order. Every process loads the
model, does a 1-step warm-up, then times one full generation (text encoding,
denoising, VAE decode). Reported per configuration: median wall time and CPU time
with their ratio to diffusers (and the best run's ratio, the least disturbed by other
work on a shared machine), peak RSS and its ratio, and PSNR of the frames against
vidloom's plain (uncached) output.

    python bench/vs_diffusers.py [--sizes tiny,mid] [--runs 3] [--configs a,b]
    python bench/vs_diffusers.py --rescore bench/results/vs_diffusers-mid.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from checkpoints import SIZES, BenchSize, ensure_checkpoint
from report import environment, print_table, psnr, wait_for_quiet, write_json

PROMPT = "a red fox jumps over a frozen river"
NEGATIVE = "blurry, low quality"
SEED = 42
GUIDANCE = 5.0


@dataclass(frozen=True)
class BenchConfig:
    """One row of the table: which engine, with which options."""

    engine: str
    """"diffusers" or "vidloom"."""
    deploy: tuple[tuple[str, Any], ...] = ()
    """vidloom DeployConfig fields (a threshold of None takes the size's threshold for the policy)."""
    cache_dit: bool = False
    """diffusers only: enable cache-dit's DBCache (F1B0, the same method as fbcache)."""
    needs: str | None = None
    """Importable module the row needs (flash_attn, sageattention), or None."""
    cuda_only: bool = False
    """Skip on CPU."""


CONFIGS: dict[str, BenchConfig] = {
    "diffusers": BenchConfig("diffusers"),
    "diffusers+cache-dit": BenchConfig("diffusers", cache_dit=True, needs="cache_dit"),
    "vidloom": BenchConfig("vidloom"),
    "vidloom batched-cfg": BenchConfig("vidloom", (("cfg_mode", "batched"),)),
    "vidloom teacache": BenchConfig("vidloom", (("step_cache", "teacache"),)),
    "vidloom fbcache": BenchConfig("vidloom", (("step_cache", "fbcache"),)),
    "vidloom batched+fbcache": BenchConfig("vidloom", (("cfg_mode", "batched"), ("step_cache", "fbcache"))),
    "vidloom flash": BenchConfig("vidloom", (("attention_backend", "flash"),), needs="flash_attn", cuda_only=True),
    "vidloom sage": BenchConfig("vidloom", (("attention_backend", "sage"),), needs="sageattention", cuda_only=True),
}
BASELINE, PLAIN = "diffusers", "vidloom"


# -- worker: one configuration, one process ---------------------------------------------


def _device() -> tuple[str, str]:
    import torch

    return ("cuda", "bfloat16") if torch.cuda.is_available() else ("cpu", "float32")


def _run_diffusers(folder: Path, size: BenchSize, config: BenchConfig, steps: int) -> tuple[Any, dict]:
    import torch
    from diffusers import WanPipeline

    device, dtype = _device()
    pipe = WanPipeline.from_pretrained(str(folder), dtype=getattr(torch, dtype)).to(device)
    pipe.set_progress_bar_config(disable=True)
    extra: dict[str, Any] = {}
    if config.cache_dit:
        import cache_dit

        # F1B0 with only step 1 forced: the same rule and threshold as vidloom's fbcache.
        cache_dit.enable_cache(pipe, cache_config=cache_dit.DBCacheConfig(
            Fn_compute_blocks=1, Bn_compute_blocks=0, residual_diff_threshold=size.thresholds["fbcache"],
            max_warmup_steps=1))
        extra["cache_dit"] = {"method": "DBCache F1B0", "threshold": size.thresholds["fbcache"]}

    def generate(n: int) -> Any:
        return pipe(prompt=PROMPT, negative_prompt=NEGATIVE, height=size.height, width=size.width,
                    num_frames=size.num_frames, num_inference_steps=n, guidance_scale=GUIDANCE,
                    generator=torch.Generator("cpu").manual_seed(SEED), output_type="np").frames[0]

    generate(1)
    _sync()
    started = _clock()
    frames = generate(steps)
    timing = _since(started)
    if config.cache_dit:
        stats = cache_dit.summary(pipe, logging=False)[0]
        extra["cache_dit"]["cached_steps"] = len(stats.cached_steps)
    return frames, {**timing, **extra}


def _run_vidloom(folder: Path, size: BenchSize, config: BenchConfig, steps: int) -> tuple[Any, dict]:
    from vidloom.core.deploy import DeployConfig
    from vidloom.core.request import GenerationRequest
    from vidloom.generator import VideoGenerator

    device, dtype = _device()
    options = dict(config.deploy)
    if "step_cache" in options:
        options["step_cache_threshold"] = size.thresholds[options["step_cache"]]
    gen = VideoGenerator.from_pretrained(folder, device=device, dtype=dtype, deploy=DeployConfig(**options))

    def generate(n: int) -> dict[str, Any]:
        return gen.engine.run(GenerationRequest(
            PROMPT, negative_prompt=NEGATIVE, height=size.height, width=size.width, num_frames=size.num_frames,
            num_inference_steps=n, guidance_scale=GUIDANCE, seed=SEED))

    generate(1)
    _sync()
    started = _clock()
    outputs = generate(steps)
    timing = _since(started)
    video = outputs["video"]
    if video.dtype == np.uint8:  # on CUDA the frames come back as uint8 (converted on the device)
        video = video.astype(np.float32) / 255.0
    return video, {**timing, **({"step_cache": outputs["step_cache"]} if "step_cache" in outputs else {})}


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _clock() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def _since(started: tuple[float, float]) -> dict[str, float]:
    _sync()
    return {"wall_s": time.perf_counter() - started[0], "cpu_s": time.process_time() - started[1]}


def worker(size_name: str, config_name: str, frames_path: Path) -> None:
    size, config = SIZES[size_name], CONFIGS[config_name]
    folder = ensure_checkpoint(size_name)
    run = _run_diffusers if config.engine == "diffusers" else _run_vidloom
    frames, result = run(folder, size, config, size.steps)
    np.save(frames_path, np.asarray(frames, dtype=np.float32))
    result["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    import torch

    if torch.cuda.is_available():
        result["peak_cuda_mib"] = torch.cuda.max_memory_allocated() / 2**20
    print("RESULT " + json.dumps(result))


# -- driver -----------------------------------------------------------------------------


def _unavailable(config: BenchConfig, cuda: bool) -> str | None:
    if config.cuda_only and not cuda:
        return "needs CUDA"
    if config.needs and importlib.util.find_spec(config.needs) is None:
        return f"{config.needs} is not installed"
    return None


def _spawn(size: str, config: str, frames: Path, timeout: float) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, __file__, "--worker", size, config, str(frames)],
                          capture_output=True, text=True, timeout=timeout)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        return {"error": (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]}
    return json.loads(lines[-1].removeprefix("RESULT "))


def bench_size(size_name: str, names: list[str], runs: int, cuda: bool) -> dict[str, Any]:
    size = SIZES[size_name]
    ensure_checkpoint(size_name)  # built once here, not timed in any worker
    skipped = {n: why for n in names if (why := _unavailable(CONFIGS[n], cuda))}
    active = [n for n in names if n not in skipped]
    samples: dict[str, list[dict[str, Any]]] = {n: [] for n in active}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(runs):
            for name in active if r % 2 == 0 else active[::-1]:
                frames = Path(tmp) / f"{name.replace(' ', '_')}-{r}.npy"
                busy = wait_for_quiet()
                result = _spawn(size_name, name, frames, timeout=3600)
                result["frames"], result["busy_before"] = str(frames), busy
                samples[name].append(result)
                print(f"  [{size_name} run {r + 1}/{runs}] {name}: "
                      f"{result.get('wall_s', result.get('error'))}", file=sys.stderr, flush=True)
        rows = _summarize(samples)
    return {"size": size_name, "request": _request(size), "runs": runs, "configs": rows, "skipped": skipped}


def _summarize(samples: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    reference = _frames(samples.get(PLAIN, []))
    rows: dict[str, Any] = {}
    for name, results in samples.items():
        ok = [r for r in results if "error" not in r]
        if not ok:
            rows[name] = {"error": results[0].get("error") if results else "no runs"}
            continue
        frames = _frames(ok)
        row = {
            "wall_s": round(statistics.median(r["wall_s"] for r in ok), 3),
            "cpu_s": round(statistics.median(r["cpu_s"] for r in ok), 3),
            "peak_rss_mib": round(statistics.median(r["peak_rss_mib"] for r in ok), 1),
            "wall_s_all": [round(r["wall_s"], 3) for r in ok],
            "machine_busy_before": [r["busy_before"] for r in ok],
            "psnr_vs_vidloom_db": psnr(frames, reference) if reference is not None else None,
            "max_abs_diff_vs_vidloom": float(np.abs(frames - reference).max()) if reference is not None else None,
        }
        for key in ("step_cache", "cache_dit", "peak_cuda_mib"):
            if key in ok[-1]:
                row[key] = ok[-1][key]
        rows[name] = row
    return _add_ratios(rows)


def _add_ratios(rows: dict[str, Any]) -> dict[str, Any]:
    """Ratios to diffusers, from the medians and from the best run of each row.

    The best run is the one least disturbed by other work on a shared machine; the
    median is what a user would typically see. Both are kept.
    """
    for row in rows.values():
        if "wall_s_all" in row:
            row["wall_s_min"] = min(row["wall_s_all"])
    base = rows.get(BASELINE, {})
    for row in rows.values():
        for key, ratio in (("wall_s", "wall_ratio_vs_diffusers"), ("wall_s_min", "wall_min_ratio_vs_diffusers"),
                           ("cpu_s", "cpu_ratio_vs_diffusers"), ("peak_rss_mib", "rss_ratio_vs_diffusers")):
            if key in row and key in base:
                row[ratio] = round(row[key] / base[key], 3)
    return rows


def _frames(results: list[dict[str, Any]]) -> np.ndarray | None:
    ok = [r for r in results if "error" not in r]
    return np.load(ok[0]["frames"]) if ok else None


def _request(size: BenchSize) -> dict[str, Any]:
    return {"height": size.height, "width": size.width, "num_frames": size.num_frames, "steps": size.steps,
            "guidance_scale": GUIDANCE, "seed": SEED, "prompt": PROMPT, "negative_prompt": NEGATIVE,
            "step_cache_thresholds": size.thresholds, "architecture": asdict(size.spec)["transformer"]}


def _print(report: dict[str, Any]) -> None:
    print(f"\n{report['size']}: {report['request']['height']}x{report['request']['width']}x"
          f"{report['request']['num_frames']}, {report['request']['steps']} steps, CFG {GUIDANCE}, "
          f"median of {report['runs']}")
    rows = []
    for name, r in report["configs"].items():
        if "error" in r:
            rows.append([name, "error", "", "", "", "", "", str(r["error"])[:60]])
            continue
        cache = r.get("step_cache") or r.get("cache_dit") or {}
        skipped = cache.get("skipped_steps", cache.get("cached_steps", ""))
        rows.append([name, f"{r['wall_s']:.2f}", f"{r.get('wall_ratio_vs_diffusers', float('nan')):.2f}x",
                     f"{r.get('wall_min_ratio_vs_diffusers', float('nan')):.2f}x",
                     f"{r.get('cpu_ratio_vs_diffusers', float('nan')):.2f}x",
                     f"{r['peak_rss_mib']:.0f} ({r.get('rss_ratio_vs_diffusers', float('nan')):.2f}x)",
                     f"{float(r['psnr_vs_vidloom_db']):.1f}", str(skipped)])
    for name, why in report["skipped"].items():
        rows.append([name, "skipped", "", "", "", "", "", why])
    print_table(["config", "wall s", "wall/diffusers", "best/best", "cpu/diffusers", "peak RSS MiB", "PSNR dB",
                 "skipped steps"], rows)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        return worker(sys.argv[2], sys.argv[3], Path(sys.argv[4]))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="tiny,mid", help=f"comma list of {', '.join(SIZES)}")
    parser.add_argument("--runs", type=int, default=3, help="fresh processes per configuration")
    parser.add_argument("--configs", default=",".join(CONFIGS), help="comma list of rows")
    parser.add_argument("--rescore", metavar="JSON", help="recompute ratios of a saved result and print it")
    args = parser.parse_args()
    if args.rescore:
        report = json.loads(Path(args.rescore).read_text())
        report["configs"] = _add_ratios(report["configs"])
        _print(report)
        write_json(Path(args.rescore).name, report)
        return
    import torch

    cuda = torch.cuda.is_available()
    names = args.configs.split(",")
    for name in names + args.sizes.split(","):
        if name not in CONFIGS and name not in SIZES:
            raise SystemExit(f"unknown config or size {name!r}; configs: {', '.join(CONFIGS)}; sizes: {', '.join(SIZES)}")
    for size_name in args.sizes.split(","):
        if SIZES[size_name].needs_cuda and not cuda:
            print(f"skipping size {size_name}: needs CUDA", file=sys.stderr)
            continue
        started = time.perf_counter()
        report = bench_size(size_name, names, args.runs, cuda)
        report["bench_wall_s"] = round(time.perf_counter() - started, 1)
        report["environment"] = environment()
        _print(report)
        write_json(f"vs_diffusers-{size_name}.json", report)


if __name__ == "__main__":
    main()
