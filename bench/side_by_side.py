"""One table per family: vidloom's default (the CPU fast path) and float32 beside the reference pipeline at its
default dtype (float32) and at bfloat16, on the same mid-size random checkpoint, prompt, seed, size and steps
(bench/family_bench.py): Wan2.1, Wan2.2 TI2V, AnyFlow-FAR, Flux2 Klein, LTX-2, Cosmos3 generation, HunyuanVideo-1.5,
Helios, Qwen-Image, Stable Audio (its waveform compared as family_bench.unit_audio maps it), and Cosmos3 chat at 16 concurrent greedy streams vs transformers' `generate` (bench/chat_streams.py).

Every (family, setting) runs in a fresh process (comparable peak RSS, no shared warm caches) with --threads
torch threads, that loads the model, runs a 1-step warm-up, then times one whole generation (text encoding,
denoising, decode), split per phase (bench/phase_split.py: CPU and wall seconds inside the text encoder, the
denoiser and the VAE, and the rest). Each family's settings run back to back and reverse their order on the next run
(A B C D, D C B A), and the machine's load average is recorded at each start. PSNR is against vidloom float32
(the parity setting), the quality gate of every fast-path setting (>= 35 dB for the default); for chat, the
share of vidloom float32's greedy tokens each setting reproduces.

    python bench/report.py [--families wan2.1-mid,ltx2-mid] [--runs 2] [--threads 1] [--out side_by_side.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from family_bench import FAMILIES, PROMPT, SEED
from phase_split import PHASES, timed_phases
from vidloom.core.openmp import spin_then_sleep

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = ("vidloom default", "vidloom float32", "reference float32", "reference bfloat16")


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def peak_rss_mib() -> float:
    """This process's peak RSS since its exec (VmHWM). getrusage's ru_maxrss is not used: Linux carries it
    across fork+exec, so a worker would report the driver's peak whenever that was higher."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)  # not Linux


def worker(name: str, setting: str, frames_path: Path, threads: int) -> dict[str, Any]:
    """One setting in this process: load, warm up with a short generation, time one whole generation."""
    import torch

    torch.set_num_threads(threads)
    bench = FAMILIES[name]
    folder = bench.checkpoint()
    if bench.pipeline == "generate":
        from chat_streams import chat_worker

        return chat_worker(folder, setting, frames_path, bench.chat_reference)
    steps = bench.request["steps"]
    t0 = time.perf_counter()
    if setting.startswith("vidloom"):
        from vidloom.generator import VideoGenerator

        dtype = None if setting == "vidloom default" else "float32"
        generator = VideoGenerator.from_pretrained(folder, device="cpu", dtype=dtype)
        used = str(generator.engine.instance.dtype).removeprefix("torch.")
        components = generator.engine.instance.components
        generate = lambda n: bench.vidloom_output(generator.engine.run(bench.vidloom_request(n)))  # noqa: E731
    else:
        import diffusers

        dtype = torch.bfloat16 if setting.endswith("bfloat16") else torch.float32
        pipe = getattr(diffusers, bench.pipeline).from_pretrained(str(folder), dtype=dtype, **bench.load_kwargs)
        pipe.set_progress_bar_config(disable=True)
        used = str(dtype).removeprefix("torch.")
        components = pipe.components

        def generate(n: int) -> np.ndarray:
            with torch.inference_mode():
                return np.asarray(bench.reference_call(pipe, bench.request, n), dtype=np.float32)
    load_s = time.perf_counter() - t0
    generate(bench.warmup_steps)
    wall0, cpu0 = time.perf_counter(), _cpu_s()
    frames, phases = timed_phases(components, lambda: generate(steps))
    wall, cpu = time.perf_counter() - wall0, _cpu_s() - cpu0
    frames = frames.astype(np.float32) / 255.0 if frames.dtype == np.uint8 else frames.astype(np.float32)
    np.save(frames_path, frames)
    return {"dtype": used, "load_s": round(load_s, 2), "wall_s": round(wall, 3), "cpu_s": round(cpu, 3),
            "peak_rss_mib": peak_rss_mib(), "steps": steps, "phases": phases}


WORKER_TIMEOUT_S = 900.0
"""One setting's process at most (a stuck reference must not stall the whole report)."""


def _spawn(name: str, setting: str, frames: Path, threads: int) -> dict[str, Any]:
    load = round(os.getloadavg()[0], 2)
    command = [sys.executable, __file__, "--worker", name, "--setting", setting, "--frames", str(frames),
               "--threads", str(threads)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": str(threads)}
    if setting.startswith("vidloom"):  # what `import vidloom` sets (the worker loads torch first: phase_split)
        spin_then_sleep(env, {})
    try:
        proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=WORKER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {WORKER_TIMEOUT_S:.0f} s", "loadavg_1m_at_start": load}
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-8:]
        return {"error": " | ".join(tail), "loadavg_1m_at_start": load}
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "loadavg_1m_at_start": load}


def measure(families: tuple[str, ...], runs: int, threads: int, tmp: Path, flip: int = 0) -> dict[str, Any]:
    """Every family's settings, `runs` times each, alternating the order (reversed on odd runs, and on even
    ones when `flip` is odd, so one-run reports alternate from family to family); quality vs vidloom float32."""
    table: dict[str, Any] = {}
    for name in families:
        FAMILIES[name].checkpoint()  # written once here, outside every timed process
        samples: dict[str, list[dict[str, Any]]] = {s: [] for s in SETTINGS}
        for run in range(runs):
            for setting in SETTINGS if (run + flip) % 2 == 0 else SETTINGS[::-1]:
                frames = tmp / f"{name}-{setting.replace(' ', '_')}-{run}.npy"
                row = _spawn(name, setting, frames, threads)
                if "error" not in row:
                    row["frames"] = str(frames)
                samples[setting].append(row)
                print(f"  {name} {setting} run {run}: {row.get('wall_s', row.get('error'))}", flush=True)
        table[name] = {"request": FAMILIES[name].request, "architecture": FAMILIES[name].architecture,
                       "reference": FAMILIES[name].pipeline, "settings": _summarise(samples)}
    return table


def _quality(ours: np.ndarray, ref: np.ndarray) -> dict[str, Any]:
    from chat_streams import token_match
    from vidloom.parity.quality import psnr

    if ours.dtype == np.int64:
        return {"token_match_vs_vidloom_float32": token_match(ours, ref)}
    if ours.shape != ref.shape:
        return {"psnr_vs_vidloom_float32_db": None}
    return {"psnr_vs_vidloom_float32_db": round(psnr(ours, ref), 2)}


def _summarise(samples: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    reference = next((r["frames"] for r in samples.get("vidloom float32", []) if "frames" in r), None)
    rows: dict[str, Any] = {}
    for setting, runs in samples.items():
        good = [r for r in runs if "error" not in r]
        if not good:
            rows[setting] = {"error": runs[0]["error"] if runs else "not run"}
            continue
        keys = [k for k in ("wall_s", "cpu_s", "peak_rss_mib", "load_s", "tokens_per_s", "tokens") if k in good[0]]
        row: dict[str, Any] = {key: statistics.median(r[key] for r in good) for key in keys}
        row.update(dtype=good[0]["dtype"], runs=len(good), wall_s_all=[r["wall_s"] for r in good],
                   loadavg_1m_at_start=[r["loadavg_1m_at_start"] for r in runs])
        if all("phases" in r for r in good):  # the per-phase split (bench/phase_split.py), medians
            row["phases"] = {phase: {key: statistics.median(r["phases"][phase][key] for r in good)
                                     for key in ("cpu_s", "wall_s")} for phase in (*PHASES, "other")}
        if reference is not None:
            row.update(_quality(np.load(good[0]["frames"]), np.load(reference)))
        rows[setting] = row
    _ratios(rows)
    return rows


def speedups(base: dict[str, Any], row: dict[str, Any]) -> tuple[float | None, float | None]:
    """(wall, CPU) speed-up of `row` over `base` (>1: faster); chat: tokens/s and CPU s per token."""
    if "wall_s" not in base or "wall_s" not in row:
        return None, None
    if "tokens_per_s" in row:
        wall = row["tokens_per_s"] / base["tokens_per_s"]
        cpu = (base["cpu_s"] / base["tokens"]) / (row["cpu_s"] / row["tokens"])
    else:
        wall, cpu = base["wall_s"] / row["wall_s"], base["cpu_s"] / row["cpu_s"]
    return round(wall, 2), round(cpu, 2)


def _ratios(rows: dict[str, Any]) -> None:
    """Each row's speed-up over the reference at its default dtype and at the row's own dtype."""
    for row in rows.values():
        if "error" in row:
            continue
        same = rows.get("reference bfloat16" if row["dtype"] == "bfloat16" else "reference float32", {})
        for key, base in (("vs_reference_default", rows.get("reference float32", {})), ("vs_reference_same_dtype", same)):
            wall, cpu = speedups(base, row)
            row[f"wall_speedup_{key}"], row[f"cpu_speedup_{key}"] = wall, cpu


def print_tables(table: dict[str, Any]) -> None:
    from report import print_table

    for name, family in table.items():
        rows = family["settings"]
        print(f"\n{name}: {family['request']}")
        body = []
        for setting, row in rows.items():
            if "error" in row:
                body.append([setting, "error: " + row["error"][-80:], "", "", "", "", "", ""])
                continue
            quality = row.get("psnr_vs_vidloom_float32_db", row.get("token_match_vs_vidloom_float32", "-"))
            speed = f"{row['tokens_per_s']:.0f} tok/s" if "tokens_per_s" in row else f"{row['wall_s']:.2f}"
            body.append([setting, row["dtype"], speed, f"{row['cpu_s']:.2f}", f"{row['peak_rss_mib']:.0f}",
                         str(quality), f"{row['wall_speedup_vs_reference_default']}x / "
                         f"{row['cpu_speedup_vs_reference_default']}x",
                         f"{row['wall_speedup_vs_reference_same_dtype']}x"])
        print_table(["setting", "dtype", "wall s", "CPU s", "peak RSS MiB", "quality", "vs ref fp32 (wall/CPU)",
                     "vs ref same dtype"], body)


def markdown(table: dict[str, Any]) -> str:
    """The docs' table (docs/performance-cpu.md) from a saved report's families."""
    lines = ["| family | setting | dtype | wall s | CPU s | peak RSS MiB | quality vs vidloom fp32 | "
             "vs ref default (wall / CPU) | vs ref same dtype (wall / CPU) | load at start |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, family in table.items():
        for setting, row in family["settings"].items():
            if "error" in row:
                lines.append(f"| {name} | {setting} | error: {row['error'][-60:]} | | | | | | | |")
                continue
            if "token_match_vs_vidloom_float32" in row:
                quality = f"{row['token_match_vs_vidloom_float32']:.0%} tokens"
                wall = f"{row['tokens_per_s']:.0f} tok/s ({row['wall_s']:.2f} s)"
            else:
                db = row.get("psnr_vs_vidloom_float32_db")
                quality = "exact" if db in ("inf", float("inf")) else "-" if db is None else f"{db} dB"
                wall = f"{row['wall_s']:.2f}"
            default = f"{row['wall_speedup_vs_reference_default']}x / {row['cpu_speedup_vs_reference_default']}x"
            same = f"{row['wall_speedup_vs_reference_same_dtype']}x / {row['cpu_speedup_vs_reference_same_dtype']}x"
            load = ", ".join(str(x) for x in row["loadavg_1m_at_start"])
            lines.append(f"| {name} | {setting} | {row['dtype']} | {wall} | {row['cpu_s']:.2f} | "
                         f"{row['peak_rss_mib']:.0f} | {quality} | {default} | {same} | {load} |")
    return "\n".join(lines)


def phase_markdown(table: dict[str, Any]) -> str:
    """The docs' per-phase table: CPU seconds of text encode, denoise, decode and the rest, and each phase's
    speed-up over the reference at the row's own dtype (above 1: vidloom faster)."""
    lines = ["| family | setting | dtype | text encode CPU s | denoise CPU s | decode CPU s | other CPU s | "
             "vs ref same dtype: text / denoise / decode |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, family in table.items():
        rows = family["settings"]
        for setting, row in rows.items():
            if "phases" not in row:
                continue
            same = rows.get("reference bfloat16" if row["dtype"] == "bfloat16" else "reference float32", {})
            ratios = []
            for phase in PHASES:
                ours, theirs = row["phases"][phase]["cpu_s"], same.get("phases", {}).get(phase, {}).get("cpu_s")
                ratios.append(f"{theirs / ours:.2f}x" if theirs and ours > 0.005 else "-")
            cells = [f"{row['phases'][p]['cpu_s']:.2f}" for p in (*PHASES, "other")]
            lines.append(f"| {name} | {setting} | {row['dtype']} | {' | '.join(cells)} | {' / '.join(ratios)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process (1: steadiest when "
                        "the machine is shared)")
    parser.add_argument("--out", default="side_by_side.json", help="file name under bench/results/")
    parser.add_argument("--merge", action="store_true", help="keep the other families' rows of an existing --out")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--setting", help=argparse.SUPPRESS)
    parser.add_argument("--frames", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--markdown", action="store_true", help="print the saved --out as the docs' table")
    args = parser.parse_args(argv)
    if args.markdown:
        from report import RESULTS

        families = json.loads((RESULTS / args.out).read_text())["families"]
        print(markdown(families))
        if any("phases" in row for family in families.values() for row in family["settings"].values()):
            print("\n" + phase_markdown(families))
        return 0
    if args.worker:
        print(json.dumps(worker(args.worker, args.setting, args.frames, args.threads)), flush=True)
        return 0
    from report import environment, write_json

    families = tuple(f for f in args.families.split(",") if f)
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        parser.error(f"--families: unknown {unknown}; known: {', '.join(FAMILIES)}")
    env = environment()
    started = time.perf_counter()
    from report import RESULTS

    previous = RESULTS / args.out
    table: dict[str, Any] = {}
    if args.merge and previous.exists():  # keep the families this run does not measure
        table = {k: v for k, v in json.loads(previous.read_text())["families"].items() if k in FAMILIES}
    with tempfile.TemporaryDirectory(prefix="vidloom-side-by-side-") as tmp:
        for index, name in enumerate(families):  # the JSON is rewritten after each family
            table.update(measure((name,), args.runs, args.threads, Path(tmp), flip=index))
            for row in table[name]["settings"].values():
                row.pop("frames", None)
            table[name]["environment"] = {**env, "loadavg_1m_at_end": round(os.getloadavg()[0], 2)}
            write_json(args.out, {"environment": env, "prompt": PROMPT, "seed": SEED, "runs": args.runs,
                                  "threads": args.threads, "report_wall_s": round(time.perf_counter() - started, 1),
                                  "note": "wall/CPU medians over runs; load average at each process start "
                                          "recorded; numbers taken under load are provisional; each family "
                                          "records the environment it was measured in", "families": table})
    print_tables(table)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main())
