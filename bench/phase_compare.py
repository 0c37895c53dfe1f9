"""Where a generation's CPU time goes, vidloom's default vs the reference pipeline at bfloat16, per phase.

One process, one torch thread, both sides loaded on the same mid-size checkpoint (bench/family_bench.py),
then generations alternating A, B, B, A... (after one warm-up each). Each phase is timed in CPU seconds by
bench/phase_split.py's module hooks, the same split bench/side_by_side.py reports: time inside the text
encoder's modules (and LTX-2's connectors), the denoiser's (every transformer call; per step is the total over
the steps), the decode's (VAE, LTX-2's audio VAE and vocoder), and the rest of the generation (tokenizing, the
scheduler, noise, casts, Python). The load average is recorded before each generation.

    python bench/phase_compare.py --families wan2.2-ti2v-mid,wan2.1-mid,far-mid [--rounds 2] [--out NAME]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from family_bench import FAMILIES  # noqa: E402
from phase_split import PhaseTimer  # noqa: E402

KEY_OF = {"text_encode": "text", "denoise": "denoise", "decode": "decode"}
"""phase_split's phase -> this file's row key prefix (`text_cpu_s`...), kept from its earlier results."""

Side = tuple[Mapping[str, Any], Callable[[int], np.ndarray]]
"""A loaded side: its components (what the phases are timed inside) and a generation of n steps."""


def vidloom_side(name: str, dtype: str | None, **deploy: Any) -> Side:
    from vidloom.core.deploy import DeployConfig
    from vidloom.generator import VideoGenerator

    bench = FAMILIES[name]
    generator = VideoGenerator.from_pretrained(bench.checkpoint(), device="cpu", dtype=dtype,
                                               deploy=DeployConfig(**deploy))
    run = lambda steps: np.asarray(generator.engine.run(bench.vidloom_request(steps))["video"],  # noqa: E731
                                   dtype=np.float32)
    return generator.engine.instance.components, run


def reference_side(name: str, dtype: str) -> Side:
    import diffusers
    import torch

    bench = FAMILIES[name]
    pipe = getattr(diffusers, bench.pipeline).from_pretrained(
        str(bench.checkpoint()), dtype=getattr(torch, dtype), **bench.load_kwargs)
    pipe.set_progress_bar_config(disable=True)

    def run(steps: int) -> np.ndarray:
        with torch.inference_mode():
            return np.asarray(bench.reference_call(pipe, bench.request, steps), dtype=np.float32)

    return pipe.components, run


SIDES: dict[str, Callable[[str], Side]] = {
    "vidloom default": lambda name: vidloom_side(name, None),
    "vidloom float32": lambda name: vidloom_side(name, "float32"),
    # The fast path with CFG as one forward of batch 2 (cfg_mode "batched"; the default runs two).
    "vidloom batched CFG": lambda name: vidloom_side(name, None, cfg_mode="batched"),
    "reference bfloat16": lambda name: reference_side(name, "bfloat16"),
    "reference float32": lambda name: reference_side(name, "float32"),
}


def timed_row(side: Side, steps: int) -> tuple[np.ndarray, dict[str, Any]]:
    """One generation of `steps` under a PhaseTimer: its frames and its row of CPU seconds per phase."""
    components, run = side
    load = round(os.getloadavg()[0], 2)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    with PhaseTimer(components) as timer:
        frames = run(steps)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    split = timer.split()
    row = {f"{KEY_OF[p]}_cpu_s": split[p]["cpu_s"] for p in KEY_OF}
    row["denoise_per_step_cpu_s"] = round(split["denoise"]["cpu_s"] / steps, 4)  # FAR: per step of all chunks
    row["other_cpu_s"] = split["other"]["cpu_s"]
    # transformer_calls: outermost entries into the denoiser's modules: one per forward, but a staged network
    # (FAR's, LTX-2's) is entered once per submodule its stage methods call.
    row.update(total_cpu_s=round(cpu, 3), wall_s=round(wall, 3), loadavg_1m=load,
               transformer_calls=timer.calls["denoise"], hook_calls=timer.hook_calls)
    return frames, row


def measure(name: str, sides: tuple[str, ...], rounds: int) -> dict[str, Any]:
    """Every side of one family, interleaved over `rounds`; per-phase medians and the frames' PSNR."""
    from vidloom.parity.quality import psnr

    bench = FAMILIES[name]
    steps = bench.request["steps"]
    loaded = {side: SIDES[side](name) for side in sides}
    for side in sides:
        loaded[side][1](bench.warmup_steps)
    samples: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    frames: dict[str, np.ndarray] = {}
    for index in range(rounds):
        for side in sides if index % 2 == 0 else sides[::-1]:
            frames[side], row = timed_row(loaded[side], steps)
            samples[side].append(row)
            print(f"  {name} {side} round {index}: {row}", flush=True)
    out: dict[str, Any] = {"request": bench.request, "steps": steps, "sides": {}}
    base = frames.get("vidloom float32", frames.get("reference float32"))
    for side, rows in samples.items():
        median = {k: round(statistics.median(r[k] for r in rows), 4) for k in rows[0] if k != "loadavg_1m"}
        median["loadavg_1m"] = [r["loadavg_1m"] for r in rows]
        if base is not None and frames[side].shape == base.shape:
            median["psnr_vs_float32_db"] = round(float(psnr(frames[side], base)), 2)
        out["sides"][side] = median
    return out


def main(argv: list[str] | None = None) -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", default="wan2.2-ti2v-mid,wan2.1-mid,far-mid")
    parser.add_argument("--sides", default="vidloom default,reference bfloat16")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--label", default="", help="what this run measures (e.g. before/after a change)")
    parser.add_argument("--out", default="phase_split.json", help="file name under bench/results/")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    sides = tuple(s for s in args.sides.split(",") if s)
    unknown = [s for s in sides if s not in SIDES]
    if unknown:
        parser.error(f"--sides: unknown {unknown}; known: {', '.join(SIDES)}")
    from report import RESULTS, environment, write_json

    previous = RESULTS / args.out
    import json

    saved = json.loads(previous.read_text()) if previous.exists() else {"runs": []}
    run: dict[str, Any] = {"label": args.label, "environment": environment(), "threads": args.threads,
                           "rounds": args.rounds, "families": {}}
    saved["runs"].append(run)
    for name in (f for f in args.families.split(",") if f):
        run["families"][name] = measure(name, sides, args.rounds)
        run["loadavg_1m_at_end"] = round(os.getloadavg()[0], 2)
        write_json(args.out, saved)
    return 0


if __name__ == "__main__":
    sys.exit(main())
