"""One table per family: vidloom's default (the CPU fast path) and float32 beside the reference pipeline at its
default dtype and at bfloat16, on the same demo checkpoint, prompt, seed, size and steps.

Every (family, setting) runs in a fresh process (comparable peak RSS, no shared warm caches) that loads the
model, runs a 1-step warm-up, then times one whole generation (text encoding, denoising, decode). Settings
alternate their order from run to run, and the machine's load average is recorded at each start: on a
shared machine the numbers are provisional, and the table says how loaded it was. PSNR is against
vidloom float32 (the parity setting), the quality gate of every fast-path setting (>= 35 dB for the default).

    python bench/report.py [--families wan2.1-demo,flux2-klein-demo] [--runs 2] [--out side_by_side.json]

The reference side runs where vidloom.parity has a map for the pipeline (Wan2.1, Wan2.2, Flux2 Klein);
LTX-2, Cosmos3 and AnyFlow-FAR rows show vidloom alone until their maps exist.
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

ROOT = Path(__file__).resolve().parents[1]
FAMILIES = ("wan2.1-demo", "wan2.2-demo", "far-demo", "flux2-klein-demo", "ltx2-demo", "cosmos3-demo")
SETTINGS = ("vidloom default", "vidloom float32", "reference float32", "reference bfloat16")
PROMPT = "a red fox jumps over a frozen river"
SEED = 42


def _request(demo: str, steps: int) -> Any:
    from vidloom import registry
    from vidloom.core.request import GenerationRequest, Task
    from vidloom.media.request_inputs import resolve_request

    card = registry.resolve_card(demo)
    task = Task.T2V if Task.T2V in card.tasks else Task.T2I  # image models generate from text
    return resolve_request(GenerationRequest(PROMPT, task=task, seed=SEED, num_inference_steps=steps), card)


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def worker(demo: str, setting: str, cache: Path, frames_path: Path) -> dict[str, Any]:
    """One setting in this process: load, warm up with one step, time one whole generation."""
    import torch

    from vidloom import registry
    from vidloom.generator import VideoGenerator

    card = registry.resolve_card(demo)
    checkpoint = registry.resolve_checkpoint(card, cache)
    steps = card.sampling_defaults.num_inference_steps
    t0 = time.perf_counter()
    if setting.startswith("vidloom"):
        dtype = None if setting == "vidloom default" else "float32"
        generator = VideoGenerator.from_pretrained(demo, device="cpu", dtype=dtype, cache_dir=cache)
        used = str(generator.engine.instance.dtype).removeprefix("torch.")
        generate = lambda n: generator.engine.run(_request(demo, n))["video"]  # noqa: E731
    else:
        import diffusers

        from vidloom.parity.reference import family_for

        family = family_for(checkpoint)
        dtype = torch.bfloat16 if setting.endswith("bfloat16") else torch.float32
        pipe = getattr(diffusers, family.pipeline).from_pretrained(str(checkpoint), dtype=dtype)
        pipe.set_progress_bar_config(disable=True)
        scheduler = dict(pipe.scheduler.config)
        used = str(dtype).removeprefix("torch.")

        def generate(n: int) -> np.ndarray:
            with torch.inference_mode():
                return np.asarray(family.call(pipe, scheduler, _request(demo, n), {}), dtype=np.float32)
    load_s = time.perf_counter() - t0
    generate(1)
    wall0, cpu0 = time.perf_counter(), _cpu_s()
    frames = generate(steps)
    wall, cpu = time.perf_counter() - wall0, _cpu_s() - cpu0
    frames = frames.astype(np.float32) / 255.0 if frames.dtype == np.uint8 else frames.astype(np.float32)
    np.save(frames_path, frames)
    return {"dtype": used, "load_s": round(load_s, 2), "wall_s": round(wall, 3), "cpu_s": round(cpu, 3),
            "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1), "steps": steps}


def _spawn(demo: str, setting: str, cache: Path, frames: Path) -> dict[str, Any]:
    load = round(os.getloadavg()[0], 2)
    command = [sys.executable, __file__, "--worker", demo, "--setting", setting, "--cache", str(cache),
               "--frames", str(frames)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(command, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-8:]
        return {"error": " | ".join(tail), "loadavg_1m_at_start": load}
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "loadavg_1m_at_start": load}


def _has_reference(demo: str, cache: Path) -> bool:
    import importlib.util

    from vidloom import registry
    from vidloom.parity.reference import ReferenceUnavailable, family_for

    if importlib.util.find_spec("diffusers") is None:
        return False
    try:
        family_for(registry.resolve_checkpoint(registry.resolve_card(demo), cache))
    except ReferenceUnavailable:
        return False
    return True


def measure(families: tuple[str, ...], runs: int, cache: Path, tmp: Path) -> dict[str, Any]:
    """Every family's settings, `runs` times each, alternating the order; PSNR against vidloom float32."""
    from vidloom.parity.quality import psnr

    table: dict[str, Any] = {}
    for demo in families:
        settings = [s for s in SETTINGS if s.startswith("vidloom") or _has_reference(demo, cache)]
        samples: dict[str, list[dict[str, Any]]] = {s: [] for s in settings}
        for run in range(runs):
            for setting in settings if run % 2 == 0 else settings[::-1]:
                frames = tmp / f"{demo}-{setting.replace(' ', '_')}-{run}.npy"
                row = _spawn(demo, setting, cache, frames)
                if "error" not in row:
                    row["frames"] = str(frames)
                samples[setting].append(row)
                print(f"  {demo} {setting} run {run}: {row.get('wall_s', row.get('error'))}", flush=True)
        table[demo] = _summarise(samples, psnr)
    return table


def _summarise(samples: dict[str, list[dict[str, Any]]], psnr: Any) -> dict[str, Any]:
    reference = next((r["frames"] for r in samples.get("vidloom float32", []) if "frames" in r), None)
    rows: dict[str, Any] = {}
    for setting, runs in samples.items():
        good = [r for r in runs if "error" not in r]
        if not good:
            rows[setting] = {"error": runs[0]["error"] if runs else "not run"}
            continue
        row = {key: statistics.median(r[key] for r in good) for key in ("wall_s", "cpu_s", "peak_rss_mib", "load_s")}
        row.update(dtype=good[0]["dtype"], runs=len(good), loadavg_1m_at_start=[r["loadavg_1m_at_start"] for r in runs])
        if reference is not None:
            ours, ref = np.load(good[0]["frames"]), np.load(reference)
            row["psnr_vs_vidloom_float32_db"] = round(psnr(ours, ref), 2) if ours.shape == ref.shape else None
        rows[setting] = row
    return rows


def print_tables(table: dict[str, Any]) -> None:
    from report import print_table

    for demo, rows in table.items():
        base = rows.get("reference float32", {}).get("wall_s")
        print(f"\n{demo}")
        body = []
        for setting, row in rows.items():
            if "error" in row:
                body.append([setting, "error: " + row["error"][-60:], "", "", "", "", ""])
                continue
            ratio = f"{base / row['wall_s']:.2f}x" if base else "-"
            body.append([setting, row["dtype"], f"{row['wall_s']:.2f}", f"{row['cpu_s']:.2f}",
                         f"{row['peak_rss_mib']:.0f}", str(row.get("psnr_vs_vidloom_float32_db", "-")), ratio])
        print_table(["setting", "dtype", "wall s", "CPU s", "peak RSS MiB", "PSNR dB", "speed vs ref fp32"], body)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--out", default="side_by_side.json", help="file name under bench/results/")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--setting", help=argparse.SUPPRESS)
    parser.add_argument("--cache", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--frames", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.setting, args.cache, args.frames)), flush=True)
        return 0
    from report import environment, write_json

    families = tuple(f for f in args.families.split(",") if f)
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        parser.error(f"--families: unknown {unknown}; known: {', '.join(FAMILIES)}")
    env = environment()
    with tempfile.TemporaryDirectory(prefix="vidloom-side-by-side-") as tmp:
        cache = Path(tmp) / "cache"
        table = measure(families, args.runs, cache, Path(tmp))
    for rows in table.values():
        for row in rows.values():
            row.pop("frames", None)
    env["loadavg_1m_at_end"] = round(os.getloadavg()[0], 2)
    write_json(args.out, {"environment": env, "prompt": PROMPT, "seed": SEED, "runs": args.runs,
                          "note": "wall/CPU medians over runs; load average at each process start recorded; "
                                  "numbers taken under load are provisional", "families": table})
    print_tables(table)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.exit(main())
