"""CFG as one forward of batch 2 vs two forwards of batch 1, on the CPU fast path (bfloat16), per denoiser step.

For each family: load vidloom's default (the fast path), capture one step's conditional and unconditional
transformer inputs from a real generation, then time both forms alternately (A, B, B, A, ...) in CPU seconds
with one torch thread, recording the load average; the max abs difference of the two forms' outputs is kept.
Measured here (bench/results/cfg_batch.json): 1.11x on wan2.2-ti2v-mid (192 tokens) but 0.81x on wan2.1-mid
(768 tokens) under a rising load, so the fast path keeps the reference's sequential default.

    python bench/cfg_batch.py [--families wan2.2-ti2v-mid,wan2.1-mid] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from family_bench import FAMILIES  # noqa: E402


def measure(name: str, rounds: int) -> dict[str, Any]:
    from vidloom.core.deploy import DeployConfig
    from vidloom.generator import VideoGenerator

    bench = FAMILIES[name]
    generator = VideoGenerator.from_pretrained(bench.checkpoint(), device="cpu",
                                               deploy=DeployConfig(cfg_mode="sequential"))
    transformer = generator.engine.instance["transformer"]
    calls: list[tuple[torch.Tensor, ...]] = []
    forward = transformer.forward
    transformer.forward = lambda *args: (calls.append(args), forward(*args))[1]
    generator.engine.run(bench.vidloom_request(1))
    del transformer.forward
    cond, uncond = calls[0], calls[1]
    batched = tuple(torch.cat([a.reshape(1, *a.shape[1:]) if a.ndim else a.reshape(1), b.reshape(1, *b.shape[1:])
                               if b.ndim else b.reshape(1)]) for a, b in zip(cond, uncond))
    seconds: dict[str, list[float]] = {"sequential": [], "batched": []}
    loads: list[float] = []
    with torch.inference_mode():
        forward(*cond), forward(*batched)  # warm-up
        for index in range(rounds):
            for form in ("sequential", "batched") if index % 2 == 0 else ("batched", "sequential"):
                loads.append(round(os.getloadavg()[0], 2))
                start = time.process_time()
                if form == "sequential":
                    out = torch.cat([forward(*cond), forward(*uncond)])
                else:
                    both = forward(*batched)
                seconds[form].append(round(time.process_time() - start, 4))
    median = {form: statistics.median(values) for form, values in seconds.items()}
    return {"dtype": str(generator.engine.instance.dtype), "inputs": [list(a.shape) for a in cond],
            "cpu_s_per_step": seconds, "median_cpu_s": median,
            "batched_speedup": round(median["sequential"] / median["batched"], 3),
            "max_abs_diff": float((out.float() - both.float()).abs().max()), "loadavg_1m": loads}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", default="wan2.2-ti2v-mid,wan2.1-mid")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default="cfg_batch.json", help="file name under bench/results/")
    args = parser.parse_args()
    torch.set_num_threads(1)
    from report import environment, write_json

    report: dict[str, Any] = {"environment": environment(), "threads": 1, "families": {}}
    for name in (f for f in args.families.split(",") if f):
        report["families"][name] = row = measure(name, args.rounds)
        print(name, row["median_cpu_s"], f"x{row['batched_speedup']}", flush=True)
        write_json(args.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
