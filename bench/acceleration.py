"""Per family, the plain path against each acceleration its card declares, on mid-size random checkpoints (CPU).

    OMP_NUM_THREADS=1 python bench/acceleration.py [--families wan,flux2,ltx2,far,cosmos3] [--rounds 2]
    python bench/acceleration.py --markdown    # the docs' table from the saved JSON

Settings: plain; fbcache and teacache (at a threshold that skips some steps of these random weights);
compile (backend aot_eager: inductor would build C++ kernels for minutes here); cfg batched (one forward of
batch 2 per step); policy batch (two requests of the same shape submitted together to an AsyncEngine with
policy "batch" and two slots, timed per request). A setting the card does not declare is recorded as refused,
with the load's reason. Each round runs every setting once in a rotated order (A, B, C..., then B, C, ..., A),
so the machine's load drifts over all of them alike; medians and fastest rounds, ratios against plain, PSNR of the
uint8 frames against plain, and the load average before and after each family, all in the JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
for path in (str(ROOT), str(BENCH)):
    if path not in sys.path:
        sys.path.insert(0, path)

import numpy as np  # noqa: E402
import torch  # noqa: E402

from checkpoints import cached  # noqa: E402
from report import environment, print_table, psnr, write_json  # noqa: E402

PROMPT, NEGATIVE = "a red fox jumps over a frozen river", "blurry"
SETTINGS = ("plain", "fbcache", "teacache", "compile", "cfg_batched", "policy_batch")


@dataclasses.dataclass(frozen=True)
class Family:
    """A mid-size checkpoint, the request timed on it and the step-cache thresholds that skip some steps."""

    write: Callable[[], Path]
    request: dict[str, Any]
    thresholds: dict[str, float]


def _wan() -> Path:
    from checkpoints import ensure_checkpoint

    return ensure_checkpoint("mid")


def _flux2() -> Path:
    from images_batch import SIZES

    from tests.helpers.flux2_checkpoints import write_tiny_flux2

    spec = dataclasses.replace(SIZES["mid"][0], name="klein-mid-cfg", distilled=False)  # a guided Klein
    return cached(spec.name, lambda d: write_tiny_flux2(d, spec))


def _ltx2() -> Path:
    from ltx2 import ensure

    return ensure()


def _far() -> Path:
    from far_rollout import MID

    from tests.helpers.far_checkpoints import write_tiny_far

    return cached(MID.name, lambda d: write_tiny_far(d, MID))


def _cosmos3() -> Path:
    from cosmos3_prefix import MID

    from tests.helpers.cosmos3_checkpoints import write_tiny_cosmos3

    return cached(MID.name, lambda d: write_tiny_cosmos3(d, MID))


FAMILIES: dict[str, Family] = {  # cheapest first: a run cut short still reports the first ones
    "flux2": Family(_flux2, dict(height=128, width=128, num_inference_steps=8, guidance_scale=3.5, task="t2i"),
                    {"fbcache": 1.2, "teacache": 1.0}),
    "cosmos3": Family(_cosmos3, dict(height=128, width=128, num_frames=9, fps=16, num_inference_steps=8,
                                     guidance_scale=4.0), {"fbcache": 0.1, "teacache": 0.1}),
    "far": Family(_far, dict(height=128, width=128, num_frames=17, num_inference_steps=4, guidance_scale=3.0),
                  {"fbcache": 1.2, "teacache": 1.0}),
    "ltx2": Family(_ltx2, dict(height=256, width=256, num_frames=9, fps=24, num_inference_steps=6, guidance_scale=3.0),
                   {"fbcache": 1.0, "teacache": 1.2}),
    "wan": Family(_wan, dict(height=128, width=128, num_frames=9, num_inference_steps=10, guidance_scale=5.0),
                  {"fbcache": 1.2, "teacache": 0.6}),
}


def _request(family: Family, seed: int = 0) -> Any:
    from vidloom.core.request import GenerationRequest, Task

    fields = dict(family.request)
    task = Task(fields.pop("task")) if "task" in fields else Task.T2V
    negative = None if task == Task.T2I else NEGATIVE  # Klein encodes its own empty negative prompt
    return GenerationRequest(prompt=PROMPT, negative_prompt=negative, task=task, seed=seed, **fields)


def _deploy(setting: str, family: Family) -> dict[str, Any]:
    if setting in ("fbcache", "teacache"):
        return {"step_cache": setting, "step_cache_threshold": family.thresholds[setting]}
    if setting == "compile":
        return {"compile": True, "compile_backend": "aot_eager"}
    if setting == "cfg_batched":
        return {"cfg_mode": "batched"}
    return {}


def _frames(output: Any) -> np.ndarray:
    """The output's frames in [0, 1] (report.psnr's scale), from the uint8 frames a user gets."""
    frames = np.asarray(output.frames)
    return frames.astype(np.float64) / 255.0 if frames.dtype == np.uint8 else frames


class Runner:
    """One loaded generator per setting of one family; `once(setting)` times one request (two for policy_batch)."""

    def __init__(self, name: str, family: Family) -> None:
        from vidloom.core.deploy import DeployConfig
        from vidloom.core.errors import DeployError
        from vidloom.generator import VideoGenerator

        self.family, self.folder = family, family.write()
        self.generators: dict[str, Any] = {}
        self.refused: dict[str, str] = {}
        for setting in SETTINGS:
            if setting == "policy_batch":
                continue
            try:
                self.generators[setting] = VideoGenerator.from_pretrained(
                    self.folder, device="cpu", deploy=DeployConfig(**_deploy(setting, family)))
            except DeployError as exc:
                self.refused[setting] = str(exc)
        self.settings = [s for s in SETTINGS if s not in self.refused]
        self.frames: dict[str, np.ndarray] = {}
        self.meta: dict[str, Any] = {}
        self.batch_stats: dict[str, Any] = {}

    def once(self, setting: str) -> float:
        if setting == "policy_batch":
            return self._batch()
        gen = self.generators[setting]
        started = time.perf_counter()
        out = gen.run(_request(self.family))
        elapsed = time.perf_counter() - started
        self.frames[setting] = _frames(out)
        self.meta[setting] = out.metadata.get("step_cache") if hasattr(out, "metadata") else None
        return elapsed

    def _batch(self) -> float:
        """Two requests (seeds 0 and 1) submitted together; seconds per request."""
        from vidloom.runtime.async_engine import AsyncEngine

        engine = AsyncEngine(self.generators["plain"].engine, policy="batch", slots=2, queue_size=4)
        try:
            started = time.perf_counter()
            handles = [engine.submit(_request(self.family, seed)) for seed in (0, 1)]
            outputs = [h.wait(600) for h in handles]
            elapsed = time.perf_counter() - started
            self.batch_stats = dict(engine.batch_stats)
        finally:
            engine.close()
        self.frames["policy_batch"] = _frames(outputs[0])
        return elapsed / 2


def measure(name: str, rounds: int) -> dict[str, Any]:
    load_before = os.getloadavg()[0]
    runner = Runner(name, FAMILIES[name])
    for setting in ("plain", "compile"):  # warm-up: first-call allocations, compile's traces
        if setting in runner.settings:
            runner.once(setting)
    times: dict[str, list[float]] = {s: [] for s in runner.settings}
    order = list(runner.settings)
    for index in range(rounds):
        for setting in order[index % len(order):] + order[: index % len(order)]:
            times[setting].append(runner.once(setting))
    plain, plain_fastest = statistics.median(times["plain"]), min(times["plain"])
    rows = {}
    for setting in runner.settings:
        median = statistics.median(times[setting])
        rows[setting] = {
            "median_s": median, "times_s": times[setting], "speedup_vs_plain": plain / median,
            # Load only ever adds time: on a shared machine the fastest round is the least disturbed one.
            "fastest_s": min(times[setting]), "speedup_fastest_vs_plain": plain_fastest / min(times[setting]),
            "psnr_vs_plain_db": psnr(runner.frames[setting], runner.frames["plain"]),
            "step_cache": runner.meta.get(setting),
        }
    if "policy_batch" in rows:
        rows["policy_batch"]["batch_stats"] = runner.batch_stats
    return {"family": name, "checkpoint": runner.folder.name, "request": FAMILIES[name].request,
            "thresholds": FAMILIES[name].thresholds, "settings": rows, "refused": runner.refused,
            "loadavg_before": load_before, "loadavg_after": os.getloadavg()[0]}


def _print(result: dict[str, Any]) -> None:
    rows = []
    for setting, row in result["settings"].items():
        cache = row.get("step_cache") or {}
        skipped = f"{cache.get('skipped_steps')}/{cache.get('skipped_steps', 0) + cache.get('computed_steps', 0)}" \
            if cache else ""
        psnr_db = row["psnr_vs_plain_db"]
        rows.append([setting, f"{row['median_s']:.2f}", f"{row['speedup_vs_plain']:.2f}x",
                     "exact" if psnr_db == float("inf") else f"{psnr_db:.1f}", skipped])
    for setting, why in result["refused"].items():
        rows.append([setting, "refused", "", "", why.splitlines()[0][:60]])
    print(f"\n{result['family']} ({result['checkpoint']}), load {result['loadavg_before']:.1f} -> "
          f"{result['loadavg_after']:.1f}")
    print_table(["setting", "s / request", "vs plain", "PSNR dB", "skipped steps"], rows)


def _describe(request: dict[str, Any], checkpoint: str) -> str:
    shape = f"{request['height']}x{request['width']}" + (f"x{request['num_frames']}" if "num_frames" in request else "")
    return f"{checkpoint}, {shape}, {request['num_inference_steps']} steps"


def markdown(results: list[dict[str, Any]]) -> str:
    """The docs' table (docs/acceleration.md) from a saved run: per setting, the fastest round against plain's
    fastest, the median against plain's median, PSNR against plain and the steps a step cache skipped."""
    lines = ["| family (request) | plain (fastest / median) | " + " | ".join(SETTINGS[1:]) + " | load |",
             "| --- " * (len(SETTINGS) + 2) + "|"]
    for result in results:
        rows, cells = result["settings"], []
        for setting in SETTINGS[1:]:
            if setting in result["refused"]:
                cells.append("refused")
                continue
            row = rows[setting]
            db = row["psnr_vs_plain_db"]
            notes = ["exact" if db in ("inf", float("inf")) else f"{db:.1f} dB"]
            cache = row.get("step_cache") or {}
            if cache:
                total = cache.get("skipped_steps", 0) + cache.get("computed_steps", 0)
                notes.append(f"{cache.get('skipped_steps')}/{total} skipped @ {result['thresholds'][setting]}")
            if setting == "policy_batch" and row.get("batch_stats"):
                notes.append(f"mean batch {row['batch_stats'].get('mean_batch', 0):.1f}")
            cells.append(f"{row['speedup_fastest_vs_plain']:.2f}x / {row['speedup_vs_plain']:.2f}x "
                         f"({', '.join(notes)})")
        plain = rows["plain"]
        lines.append(f"| {result['family']} ({_describe(result['request'], result['checkpoint'])}) | "
                     f"{plain['fastest_s']:.2f} / {plain['median_s']:.2f} s | {' | '.join(cells)} | "
                     f"{result['loadavg_before']:.0f}-{result['loadavg_after']:.0f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default=",".join(FAMILIES), help=f"comma list of {', '.join(FAMILIES)}")
    parser.add_argument("--rounds", type=int, default=2, help="timed rounds per setting (after one warm-up)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--out", default="acceleration-mid-cpu.json")
    parser.add_argument("--markdown", action="store_true", help="print the saved --out as the docs' table")
    parser.add_argument("--merge", action="store_true", help="keep the other families' results of an existing --out")
    args = parser.parse_args()
    if args.markdown:
        from report import RESULTS

        print(markdown(json.loads((RESULTS / args.out).read_text())["families"]))
        return
    names = [n.strip() for n in args.families.split(",") if n.strip()]
    unknown = [n for n in names if n not in FAMILIES]
    if unknown:
        raise SystemExit(f"--families: unknown {unknown}; known: {', '.join(FAMILIES)}")
    torch.set_num_threads(args.threads)
    from report import RESULTS

    previous = RESULTS / args.out
    kept = []
    if args.merge and previous.exists():
        saved = json.loads(previous.read_text())
        # A family saved before results carried their own rounds ran with the file's.
        kept = [{"rounds": saved["args"]["rounds"], **r} for r in saved["families"] if r["family"] not in names]
    results: list[dict[str, Any]] = []
    for name in names:
        results.append({**measure(name, args.rounds), "rounds": args.rounds, "environment": environment()})
        _print(results[-1])
        ordered = sorted([*kept, *results], key=lambda r: list(FAMILIES).index(r["family"]))
        write_json(args.out, {"environment": environment(), "args": vars(args), "families": ordered})


if __name__ == "__main__":
    main()
