"""Every family on one, two and four processes: wall time and per-rank memory of each parallel plan.

For each family's mid-size checkpoint (bench/family_bench.py, the side-by-side report's workloads) every plan
of `--plans` gets a fresh pool (bench/parallel.py's `run_plan`: one 1-step warm-up request, then `--runs`
timed requests): rank 0's median denoise-step time, the parent's median end-to-end time, each rank's peak
and final resident memory, and the largest difference of the frames from the first plan's (the plans must
agree; float32 on CPU). A plan the family refuses (no CFG to split, a size that does not shard) is a row
with the refusal's message, not a failure.

On this 2-core CPU the ranks share the cores the single process already uses, so wall time cannot drop much
here: what the rows show is that every plan runs and agrees, and what each costs in start-up and memory
(`sp2shard` against `sp2`: per-rank weights after sharding). On CUDA each rank gets its own GPU; the GPU
check runs the two-GPU rows (`bench/gpu_check.sh`, skipped with a reason on a one-GPU machine).

    python bench/parallel_families.py [--families flux2-klein-mid,ltx2-mid] [--plans 1,sp2,cfg2,sp2xcfg2,sp2shard]
                                      [--steps N] [--runs 1] [--json parallel-families.json]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

BENCH = Path(__file__).resolve().parent
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

from family_bench import FAMILIES, FamilyBench  # noqa: E402
import parallel  # noqa: E402
from parallel import PLANS, run_plan  # noqa: E402
from report import environment, print_table, write_json  # noqa: E402

DEFAULT_PLANS = "1,sp2,cfg2,sp2xcfg2,sp2shard"
GENERATION = tuple(name for name, bench in FAMILIES.items() if bench.chat_reference is None)
"""The families' generation rows (chat rows have no denoiser to shard)."""


def run_family(bench: FamilyBench, plans: list[str], device: str, runs: int, steps: int | None,
               checkpoint: Path | None = None) -> list[dict[str, Any]]:
    """One row per plan of `plans` on `bench`'s checkpoint (`checkpoint` overrides where it is written)."""
    folder = checkpoint or bench.checkpoint()
    request = bench.vidloom_request(steps or bench.request["steps"])
    rows: list[dict[str, Any]] = []
    first: np.ndarray | None = None
    for name in plans:
        plan = PLANS[name]
        if device == "cuda" and torch.cuda.device_count() < plan.world_size:
            rows.append({"plan": name, "skipped": f"needs {plan.world_size} GPUs, "
                                                  f"{torch.cuda.device_count()} here"})
            continue
        try:
            row = run_plan(name, folder, request, device, runs)
        except Exception as exc:  # noqa: BLE001 - a refused plan is a result, not the end of the run
            rows.append({"plan": name, "refused": f"{type(exc).__name__}: {exc}"[:300]})
            continue
        video = np.asarray(row.pop("video"), dtype=np.float64)  # uint8 on CUDA: never wrap around
        first = video if first is None else first
        row["max_abs_diff_vs_first"] = float(np.abs(video - first).max()) if video.shape == first.shape else None
        rows.append(row)
        print(f"  {bench.name} {name}: step {row['step_s_median']:.3f} s, end to end {row['end_to_end_s']:.2f} s, "
              f"peak RSS/rank {_most(row['rank_peak_rss_mib'])} MiB", flush=True)
    return rows


def _most(values: list[float | None] | None) -> str:
    found = [v for v in values or () if v is not None]
    return f"{max(found):.0f}" if found else "-"


def table_rows(family: str, rows: list[dict[str, Any]]) -> list[list[str]]:
    """The printed table's rows for one family: speed-up against its first plan that ran."""
    ran = [r for r in rows if "step_s_median" in r]
    base = ran[0]["end_to_end_s"] if ran else None
    out = []
    for r in rows:
        if "step_s_median" not in r:
            out.append([family, r["plan"], "-", "-", "-", "-", "-", "-", r.get("skipped") or r.get("refused", "")])
            continue
        diff = r["max_abs_diff_vs_first"]
        out.append([family, r["plan"], str(r["processes"]), f"{r['step_s_median']:.3f}", f"{r['end_to_end_s']:.2f}",
                    f"{base / r['end_to_end_s']:.2f}x" if base else "-", _most(r["rank_peak_rss_mib"]),
                    _most(r["rank_rss_after_mib"]), "-" if diff is None else f"{diff:.1e}"])
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default=",".join(GENERATION), help=f"of {', '.join(GENERATION)}")
    parser.add_argument("--plans", default=DEFAULT_PLANS, help=f"of {', '.join(PLANS)}")
    parser.add_argument("--steps", type=int, default=None, help="denoise steps (default: each family's)")
    parser.add_argument("--runs", type=int, default=1, help="timed requests per plan (medians over all)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--json", default="parallel-families.json",
                        help="results file name under bench/results (an absolute path is written as given)")
    parser.add_argument("--quiet-wait", type=float, default=parallel.QUIET_WAIT_S,
                        help="seconds to wait at most for a quiet CPU before each timed request")
    args = parser.parse_args(argv)
    families, plans = args.families.split(","), args.plans.split(",")
    for name in families:
        if name not in GENERATION:
            parser.error(f"--families: {name!r} is not one of {', '.join(GENERATION)}")
    for name in plans:
        if name not in PLANS:
            parser.error(f"--plans: {name!r} is not one of {', '.join(PLANS)}")
    parallel.QUIET_WAIT_S = args.quiet_wait
    results: dict[str, Any] = {}
    for name in families:
        bench = FAMILIES[name]
        results[name] = {"request": {**bench.request, "steps": args.steps or bench.request["steps"]},
                         "plans": run_family(bench, plans, args.device, args.runs, args.steps)}
    print_table(["family", "plan", "procs", "step s", "e2e s", "speed-up", "peak RSS MiB/rank",
                 "RSS after MiB/rank", "max |diff|"],
                [row for name, got in results.items() for row in table_rows(name, got["plans"])])
    write_json(args.json, {"benchmark": "parallel_families", "device": args.device, "environment": environment(),
                           "runs": args.runs, "families": results})


if __name__ == "__main__":
    main()
