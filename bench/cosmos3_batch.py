"""Cosmos3 generation under `--policy batch` vs `fifo`: two concurrent requests whose prompts have equal token counts.

Both requests are submitted together to an AsyncEngine (no HTTP: this measures the device side); under `batch` their
prompt prefills and denoise steps share forwards (families/cosmos3/gen_step.py), under `fifo` each runs alone. The
rounds alternate the two policies so drifting machine load hits both alike; each reports wall and CPU seconds of the
pair (tokenize, prefill, every step, VAE decode), the load average, and how far the batched videos are from the fifo
ones (float32: matmul blocking only).

    OMP_NUM_THREADS=1 python bench/cosmos3_batch.py [--size mid|demo] [--rounds 3] [--steps 4] [--height 128]
        [--width 128] [--frames 9]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from checkpoints import cached  # noqa: E402
from cosmos3_prefix import MID  # noqa: E402
from report import environment, print_table, write_json  # noqa: E402
from tests.helpers.cosmos3_checkpoints import write_tiny_cosmos3  # noqa: E402

# The same words in another order: equal token counts under any word-piece tokenizer (checked: largest_batch).
PROMPTS = ("a red fox jumps over the lazy dog", "a red dog jumps over the lazy fox")
SIZE = dict(height=128, width=128, num_frames=9, fps=16, guidance_scale=4.0)


def _generator(size: str) -> Any:
    from vidloom.generator import VideoGenerator

    model = "cosmos3-demo" if size == "demo" else cached(MID.name, lambda folder: write_tiny_cosmos3(folder, MID))
    return VideoGenerator.from_pretrained(model, device="cpu", dtype="float32")


def _pair(engine: Any, policy: str, steps: int, seed: int, size: dict[str, Any]) -> dict[str, Any]:
    from vidloom.core.request import GenerationRequest
    from vidloom.runtime.async_engine import AsyncEngine

    requests = [GenerationRequest(prompt=p, negative_prompt="blurry", seed=seed + i, num_inference_steps=steps, **size)
                for i, p in enumerate(PROMPTS)]
    async_engine = AsyncEngine(engine, policy=policy, slots=2, queue_size=4, batch_wait_s=0.2)
    load = os.getloadavg()[0]
    started, cpu_started = time.perf_counter(), time.process_time()
    try:
        handles = [async_engine.submit(r, result=lambda slots: slots) for r in requests]
        videos = [np.asarray(h.wait(600)["video"], dtype=np.float32) for h in handles]
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
        stats = async_engine.batch_stats
    finally:
        async_engine.close()
    return {"policy": policy, "wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "load_1min": round(load, 2),
            "mean_batch": stats["mean_batch"] if policy == "batch" else 1.0,
            "largest_batch": stats["largest_batch"] if policy == "batch" else 1, "videos": videos}


def run(size: str, rounds: int, steps: int, request: dict[str, Any]) -> dict[str, Any]:
    gen = _generator(size)
    _pair(gen.engine, "batch", 1, 0, request)  # warm-up
    rows: list[dict[str, Any]] = []
    for r in range(rounds):
        for policy in (("fifo", "batch") if r % 2 == 0 else ("batch", "fifo")):
            rows.append(_pair(gen.engine, policy, steps, 10 * r, request))
    diffs = []
    for r in range(rounds):
        fifo, batch = (next(x for x in rows[2 * r: 2 * r + 2] if x["policy"] == p) for p in ("fifo", "batch"))
        diffs.append(max(float(np.abs(a - b).max()) for a, b in zip(fifo["videos"], batch["videos"])))
    for row in rows:
        del row["videos"]
        if row["policy"] == "batch" and row["largest_batch"] != 2:
            raise SystemExit(f"the two requests never shared a forward: {row}")
    med = {p: {k: statistics.median(x[k] for x in rows if x["policy"] == p) for k in ("wall_s", "cpu_s")}
           for p in ("fifo", "batch")}
    return {"size": size, "steps": steps, "request": request, "prompts": PROMPTS, "rounds": rows, "median": med,
            "wall_ratio_fifo_over_batch": round(med["fifo"]["wall_s"] / med["batch"]["wall_s"], 3),
            "cpu_ratio_fifo_over_batch": round(med["fifo"]["cpu_s"] / med["batch"]["cpu_s"], 3),
            "max_abs_video_diff_batch_vs_fifo": max(diffs), "environment": environment()}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="mid", choices=("mid", "demo"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--height", type=int, default=SIZE["height"])
    parser.add_argument("--width", type=int, default=SIZE["width"])
    parser.add_argument("--frames", type=int, default=SIZE["num_frames"])
    args = parser.parse_args(argv)
    request = {**SIZE, "height": args.height, "width": args.width, "num_frames": args.frames}
    result = run(args.size, args.rounds, args.steps, request)
    print_table(["policy", "wall s", "cpu s", "load", "mean batch"],
                [[x["policy"], str(x["wall_s"]), str(x["cpu_s"]), str(x["load_1min"]), str(x["mean_batch"])]
                 for x in result["rounds"]])
    print(f"fifo/batch: wall {result['wall_ratio_fifo_over_batch']}x, cpu {result['cpu_ratio_fifo_over_batch']}x; "
          f"max |video diff| {result['max_abs_video_diff_batch_vs_fifo']:.2e}")
    write_json(f"cosmos3_batch-{args.size}-cpu.json", result)
    return result


if __name__ == "__main__":
    main()
