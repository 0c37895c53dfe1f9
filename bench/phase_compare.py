"""Where a generation's CPU time goes, vidloom's default vs the reference pipeline at bfloat16, per phase.

One process, one torch thread, both sides loaded on the same mid-size checkpoint (bench/family_bench.py),
then generations alternating A, B, A, B... (after one warm-up each). Each phase is timed in CPU seconds
(`time.process_time`) by wrapping its entry point on both sides: text encoding (vidloom's
`WanTextEncoder.encode` / the pipeline's `encode_prompt`), the denoiser (every transformer forward; per step
is the total over the steps), the VAE decode, and the rest of the generation (scheduler, noise, casts,
Python). The load average is recorded before each generation.

    python bench/phase_compare.py --families wan2.2-ti2v-mid,wan2.1-mid,far-mid [--rounds 2] [--out NAME]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from family_bench import FAMILIES  # noqa: E402

PHASES = ("text", "denoise", "decode")


class PhaseClock:
    """CPU seconds per phase, accumulated by wrapped callables (outermost call counts once)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = dict.fromkeys(PHASES, 0.0)
        self.calls: dict[str, int] = dict.fromkeys(PHASES, 0)
        self._depth = 0

    def wrap(self, owner: Any, attr: str, phase: str) -> None:
        inner: Callable[..., Any] = getattr(owner, attr)

        def timed(*args: Any, **kwargs: Any) -> Any:
            if self._depth:
                return inner(*args, **kwargs)
            self._depth += 1
            start = time.process_time()
            try:
                return inner(*args, **kwargs)
            finally:
                self._depth -= 1
                self.seconds[phase] += time.process_time() - start
                self.calls[phase] += 1

        setattr(owner, attr, timed)

    def reset(self) -> None:
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self.calls = dict.fromkeys(PHASES, 0)


def vidloom_side(name: str, clock: PhaseClock, dtype: str | None, **deploy: Any) -> Callable[[int], np.ndarray]:
    from vidloom.core.deploy import DeployConfig
    from vidloom.generator import VideoGenerator

    bench = FAMILIES[name]
    generator = VideoGenerator.from_pretrained(bench.checkpoint(), device="cpu", dtype=dtype,
                                               deploy=DeployConfig(**deploy))
    instance = generator.engine.instance
    clock.wrap(instance["text_encoder"], "encode", "text")
    if name.startswith("far"):  # the rollout runs the staged network and decodes chunk by chunk
        import vidloom.recipes.wan_causal.loop as far_loop

        for stage in ("embed_step", "embed_recompute", "run_blocks", "head", "prefill"):
            clock.wrap(instance["transformer"], stage, "denoise")
        clock.wrap(far_loop, "decode_chunk", "decode")
    else:  # LTX-2's network runs the transformer stage by stage; its audio decode counts as "other"
        for stage in ("embed", "run_blocks", "head") if name.startswith("ltx2") else ("forward",):
            clock.wrap(instance["transformer"], stage, "denoise")
        clock.wrap(instance["vae"], "decode", "decode")
    return lambda steps: np.asarray(generator.engine.run(bench.vidloom_request(steps))["video"], dtype=np.float32)


def reference_side(name: str, clock: PhaseClock, dtype: str) -> Callable[[int], np.ndarray]:
    import diffusers
    import torch

    bench = FAMILIES[name]
    pipe = getattr(diffusers, bench.pipeline).from_pretrained(
        str(bench.checkpoint()), dtype=getattr(torch, dtype), **bench.load_kwargs)
    pipe.set_progress_bar_config(disable=True)
    clock.wrap(pipe, "encode_prompt", "text")
    clock.wrap(pipe.transformer, "forward", "denoise")
    clock.wrap(pipe.vae, "decode", "decode")

    def run(steps: int) -> np.ndarray:
        with torch.inference_mode():
            return np.asarray(bench.reference_call(pipe, bench.request, steps), dtype=np.float32)

    return run


SIDES = {
    "vidloom default": lambda name, clock: vidloom_side(name, clock, None),
    "vidloom float32": lambda name, clock: vidloom_side(name, clock, "float32"),
    # The fast path with CFG as one forward of batch 2 (cfg_mode "batched"; the default runs two).
    "vidloom batched CFG": lambda name, clock: vidloom_side(name, clock, None, cfg_mode="batched"),
    "reference bfloat16": lambda name, clock: reference_side(name, clock, "bfloat16"),
    "reference float32": lambda name, clock: reference_side(name, clock, "float32"),
}


def measure(name: str, sides: tuple[str, ...], rounds: int) -> dict[str, Any]:
    """Every side of one family, interleaved over `rounds`; per-phase medians and the frames' PSNR."""
    from vidloom.parity.quality import psnr

    bench = FAMILIES[name]
    steps = bench.request["steps"]
    clocks = {side: PhaseClock() for side in sides}
    runners = {side: SIDES[side](name, clocks[side]) for side in sides}
    for side in sides:
        runners[side](bench.warmup_steps)
    samples: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    frames: dict[str, np.ndarray] = {}
    for index in range(rounds):
        for side in sides if index % 2 == 0 else sides[::-1]:
            clock = clocks[side]
            clock.reset()
            load = round(os.getloadavg()[0], 2)
            cpu0, wall0 = time.process_time(), time.perf_counter()
            frames[side] = runners[side](steps)
            cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
            row = {f"{p}_cpu_s": round(clock.seconds[p], 3) for p in PHASES}
            row["denoise_per_step_cpu_s"] = round(clock.seconds["denoise"] / steps, 4)  # FAR: per step of all chunks
            row["other_cpu_s"] = round(cpu - sum(clock.seconds.values()), 3)
            row.update(total_cpu_s=round(cpu, 3), wall_s=round(wall, 3), loadavg_1m=load,
                       transformer_calls=clock.calls["denoise"])
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
