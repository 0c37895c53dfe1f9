"""Acceleration through the denoiser contract on the families this slice reached, tiny random checkpoints, CPU:
Stable Audio plain vs fbcache / teacache / fp8 / compile (aot_eager), and two concurrent LTX-2 requests of one
shape under AsyncEngine `fifo` vs `batch`. Settings interleave (A, B, C, ..., A, B, C, ...) so machine load hits
them alike; medians and ratios to plain are reported with os.getloadavg() before and after.

    OMP_NUM_THREADS=1 python bench/denoiser_accel.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch._dynamo  # noqa: E402

from checkpoints import cached  # noqa: E402
from report import environment, print_table, write_json  # noqa: E402
from tests.helpers.ltx2_checkpoints import CONFIGS as LTX2_CONFIGS, write_tiny_ltx2  # noqa: E402
from tests.helpers.stable_audio_checkpoints import TINY_STEREO, write_tiny_stable_audio  # noqa: E402
from vidloom.core.deploy import DeployConfig  # noqa: E402
from vidloom.core.request import GenerationRequest  # noqa: E402
from vidloom.generator import VideoGenerator  # noqa: E402
from vidloom.runtime.async_engine import AsyncEngine  # noqa: E402

AUDIO_SETTINGS: dict[str, dict[str, Any]] = {
    "plain": {}, "fbcache 0.7": dict(step_cache="fbcache", step_cache_threshold=0.7),
    "teacache 0.7": dict(step_cache="teacache", step_cache_threshold=0.7), "fp8": dict(fp8_weights=True),
    "compile aot_eager": dict(compile=True, compile_backend="aot_eager"),
}
LTX2_SIZE = dict(height=64, width=64, num_frames=9, fps=25, guidance_scale=3.0, num_inference_steps=4)


def _audio_time(gen: VideoGenerator) -> float:
    start = time.perf_counter()
    gen.generate("a dog barks", negative_prompt="hiss", num_inference_steps=8, guidance_scale=3.0, seed=3)
    return time.perf_counter() - start


def _ltx2_time(engine: Any, policy: str) -> float:
    requests = [GenerationRequest(prompt=p, negative_prompt="blurry", seed=s, **LTX2_SIZE)
                for p, s in (("a red fox jumps", 1), ("rain on a lake", 2))]
    async_engine = AsyncEngine(engine, policy=policy, slots=2, queue_size=4)
    try:
        start = time.perf_counter()
        for handle in [async_engine.submit(r) for r in requests]:
            handle.wait(600)
        return time.perf_counter() - start
    finally:
        async_engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    load_before = os.getloadavg()
    audio = cached("stable-audio-tiny", lambda d: write_tiny_stable_audio(d, TINY_STEREO))
    gens = {name: VideoGenerator.from_pretrained(audio, device="cpu", deploy=DeployConfig(**deploy))
            for name, deploy in AUDIO_SETTINGS.items()}
    for gen in gens.values():  # first run: compile traces, caches warm
        _audio_time(gen)
    audio_times: dict[str, list[float]] = {name: [] for name in gens}
    for _ in range(args.rounds):
        for name, gen in gens.items():
            audio_times[name].append(_audio_time(gen))
    torch._dynamo.reset()
    engine = VideoGenerator.from_pretrained(cached("ltx2-tiny", lambda d: write_tiny_ltx2(d, LTX2_CONFIGS[0])),
                                            device="cpu").engine
    _ltx2_time(engine, "fifo")
    ltx2_times: dict[str, list[float]] = {"fifo": [], "batch": []}
    for _ in range(args.rounds):
        for policy in ltx2_times:
            ltx2_times[policy].append(_ltx2_time(engine, policy))
    load_after = os.getloadavg()
    rows, results = [], {}
    for group, times, base in (("stable-audio", audio_times, "plain"), ("ltx2 x2 requests", ltx2_times, "fifo")):
        for name, seen in times.items():
            median = statistics.median(seen)
            ratio = statistics.median(times[base]) / median
            results[f"{group} / {name}"] = {"median_s": round(median, 3), "runs_s": [round(t, 3) for t in seen],
                                             f"speedup_vs_{base}": round(ratio, 3)}
            rows.append([group, name, f"{median:.2f}", f"{ratio:.2f}x"])
    print_table(["workload", "setting", "median s", f"vs plain/fifo"], rows)
    write_json("denoiser_accel-tiny-cpu.json", {
        "environment": environment(), "loadavg_before": load_before, "loadavg_after": load_after,
        "rounds": args.rounds, "omp_threads": os.environ.get("OMP_NUM_THREADS"), "results": results,
    })


if __name__ == "__main__":
    main()
