"""LoRA cost on a random Flux2 Klein: denoise step time with 0, 1 and 4 adapters (rank 16 on every block linear),
run-time (per-request LoRALinear) vs fused into the weights at load (`fuse_loras`); throughput of 8 concurrent
requests (AsyncEngine policy "batch") with no adapters vs spread over 4 adapters, "mixed" (one forward, each
adapter applied to its own rows) vs "grouped" (one forward per adapter set); and the step gap running jobs see
while adapters load beside them (the loads run on another thread, as POST /v1/loras does: does loading stall
other jobs' steps?).

    OMP_NUM_THREADS=1 python bench/lora.py [--size tiny|mid] [--device cpu] [--only batching]

The JSON notes the machine's load average: on a shared CI box the absolute times move, the ratios less.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from images_batch import SIZES, STEPS, _checkpoint, _request  # noqa: E402
from report import environment, print_table, write_json  # noqa: E402
from tests.helpers.lora_files import LoRASpec, write_lora  # noqa: E402

CACHE = ROOT / "bench" / ".cache"
RANK = 16
# Every linear of the double and single blocks (PEFT regex, matched against the whole module name).
TARGETS = (r".*(transformer_blocks\.\d+\.(attn\.(to_q|to_k|to_v|to_out\.0|add_q_proj|add_k_proj|add_v_proj|"
           r"to_add_out)|ff\.linear_(in|out)|ff_context\.linear_(in|out))|"
           r"single_transformer_blocks\.\d+\.attn\.(to_qkv_mlp_proj|to_out))")


# The adapters loaded beside running jobs in the step-gap measure: a large rank, so that one load takes long
# enough that a step waiting for it would show as a gap of at least that length.
GAP_RANK = 128


def _adapters(folder: Path, count: int, rank: int = RANK) -> list[Path]:
    out = CACHE / f"loras-{folder.name}-r{rank}"
    paths = [out / f"Flux2KleinPipeline-{seed}.safetensors" for seed in range(count)]
    for seed, path in enumerate(paths):
        if not path.exists():
            write_lora(folder, "Flux2KleinPipeline", LoRASpec(rank=rank, alpha=rank, targets=TARGETS, seed=seed,
                                                              std=0.02), out)
    return paths


def _step_times(engine, request) -> list[float]:
    run = engine.submit(request)
    times = []
    try:
        while not run.done:
            if not run.prepare():
                continue
            started = time.perf_counter()
            with torch.inference_mode():
                result = run.execute(run.pending_plan)
            if engine.instance.device.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - started)
            run.complete(result)
    finally:
        run.close()
    return times


def _throughput(engine, requests, lora_batching: str = "mixed") -> tuple[float, dict]:
    """Images per second for `requests` submitted at once (policy batch), and the batch stats."""
    from vidloom.runtime.async_engine import AsyncEngine

    async_engine = AsyncEngine(engine, policy="batch", slots=len(requests), queue_size=len(requests),
                               lora_batching=lora_batching)
    try:
        started = time.perf_counter()
        for handle in [async_engine.submit(r) for r in requests]:
            handle.wait(600)
        return len(requests) / (time.perf_counter() - started), async_engine.batch_stats
    finally:
        async_engine.close()


def _batching(gen, names: list[str], height: int, width: int, repeats: int) -> tuple[dict, list[list[str]]]:
    """8 concurrent requests over 4 adapters, "mixed" (one forward, each adapter on its rows) vs "grouped" (one
    forward per adapter set), and the same 8 without adapters; interleaved round by round (round 0 warms up)."""
    from dataclasses import replace

    plain = [_request(i, height, width) for i in range(8)]
    mixed = [replace(r, loras=((names[i % 4], 0.5),)) for i, r in enumerate(plain)]
    settings = {"no adapters": (plain, "mixed"), "4 adapters, mixed": (mixed, "mixed"),
                "4 adapters, grouped": (mixed, "grouped")}
    rates: dict[str, list[float]] = {label: [] for label in settings}
    stats: dict[str, dict] = {}
    loads = []
    for round_ in range(repeats + 1):
        for label, (requests, mode) in settings.items():
            loads.append(os.getloadavg()[0])
            rate, stats[label] = _throughput(gen.engine, requests, mode)
            if round_:
                rates[label].append(rate)
    payload = {label: {"img_per_s_median": round(statistics.median(r), 3), "img_per_s_max": round(max(r), 3),
                       "rounds": [round(x, 3) for x in r], "batch_stats": stats[label]} for label, r in rates.items()}
    grouped = statistics.median(rates["4 adapters, grouped"])
    payload["mixed_vs_grouped"] = round(statistics.median(rates["4 adapters, mixed"]) / grouped, 3)
    payload["loadavg_per_run"] = [round(x, 2) for x in loads]
    rows = [[f"8 requests, {label}", f"{statistics.median(r):.2f} img/s median ({max(r):.2f} max)",
             f"{statistics.median(r) / grouped:.2f}x grouped"] for label, r in rates.items()]
    return payload, rows


def _gaps(events: list[tuple[str, str, float]]) -> list[float]:
    """Seconds between consecutive denoise steps of the same job (its progress events, decode excluded)."""
    last: dict[tuple[str, str], float] = {}
    gaps = []
    for request_id, phase, at in events:
        if phase != "decode":
            if (request_id, phase) in last:
                gaps.append(at - last[(request_id, phase)])
            last[(request_id, phase)] = at
    return gaps


def _step_gap(engine, requests, load=None) -> tuple[list[float], list[float]]:
    """Run `requests` back to back (policy fifo, one resident: a job's steps follow each other); the gaps between
    each job's consecutive steps, and the seconds of each adapter load `load` did on a thread meanwhile."""
    from vidloom.core.output import ProgressEvent
    from vidloom.runtime.async_engine import AsyncEngine

    events: list[tuple[str, str, float]] = []

    def record(event) -> None:
        if isinstance(event, ProgressEvent):
            events.append((event.request_id, event.phase, time.perf_counter()))

    async_engine = AsyncEngine(engine, policy="fifo", slots=1, queue_size=len(requests))
    loads: list[float] = []
    stop = threading.Event()
    loader = threading.Thread(target=lambda: loads.extend(load(stop)), daemon=True) if load else None
    try:
        handles = [async_engine.submit(r, record) for r in requests]
        if loader is not None:
            loader.start()
        for handle in handles:
            handle.wait(600)
    finally:
        stop.set()
        if loader is not None:
            loader.join()
        async_engine.close()
    return _gaps(events), loads


def _loader(gen, paths, pause_s: float):
    """Load the adapter files over and over (one name per file, replacing itself), `pause_s` between loads, until
    told to stop. pause 0 is the worst case (an admin loading adapters back to back while jobs run); a stall
    (a step waiting for a load) would show as a gap of at least one load's time over the step."""
    def run(stop: threading.Event) -> list[float]:
        times = []
        while not stop.is_set():
            for i, path in enumerate(paths):
                started = time.perf_counter()
                gen.load_lora(f"bg{i}", path)
                times.append(time.perf_counter() - started)
                stop.wait(pause_s)
        return times
    return run


def _summary(values: list[float]) -> dict:
    ms = sorted(1000 * v for v in values)
    return {"median_ms": round(statistics.median(ms), 2), "p90_ms": round(ms[int(0.9 * (len(ms) - 1))], 2),
            "max_ms": round(ms[-1], 2), "count": len(ms)} if ms else {"count": 0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=list(SIZES), default="mid")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds (every setting once per round)")
    parser.add_argument("--gap-jobs", type=int, default=3, help="jobs per step-gap round")
    parser.add_argument("--only", choices=["batching"], default=None,
                        help="run one part: batching (8 requests over 4 adapters, mixed vs grouped)")
    args = parser.parse_args()
    from dataclasses import replace

    from vidloom.generator import VideoGenerator

    folder = _checkpoint(args.size)
    _, height, width = SIZES[args.size]
    gen = VideoGenerator.from_pretrained(folder, device=args.device, max_loras=8)
    paths = _adapters(folder, 4)
    names = []
    for i, path in enumerate(paths):
        gen.load_lora(f"a{i}", path)
        names.append(f"a{i}")
    payload = {"environment": environment(), "size": args.size, "rank": RANK, "steps": STEPS,
               "dtype": str(gen.engine.instance.dtype).removeprefix("torch."),
               "load_note": f"loadavg {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores at start (a CI run of "
                            "the whole test suite shares this machine); settings are measured interleaved, round "
                            "by round, so the load drifts over all of them alike; min is the least disturbed"}
    if args.only == "batching":
        payload["batching"], rows = _batching(gen, names, height, width, args.repeats)
        print_table(["what", "value", "vs grouped"], rows)
        write_json(f"lora-batching-{args.size}-{args.device}.json", payload)
        return
    # (label, engine, the request's loras): the fused engines hold their adapters in the weights.
    settings = [("0 adapters", gen.engine, ())]
    for count in (1, 4):
        fused = VideoGenerator.from_pretrained(folder, device=args.device,
                                               fuse_loras={f"a{i}": (paths[i], 0.5) for i in range(count)})
        settings += [(f"{count} run-time", gen.engine, tuple((n, 0.5) for n in names[:count])),
                     (f"{count} fused", fused.engine, ())]
    times: dict[str, list[float]] = {label: [] for label, _, _ in settings}
    for round_ in range(args.repeats + 1):
        for label, engine, loras in settings:
            measured = _step_times(engine, replace(_request(0, height, width), loras=loras))
            if round_:  # round 0 warms every setting up
                times[label] += measured
    rows = []
    base = min(times["0 adapters"])
    for label, measured in times.items():
        payload[f"step_ms_{label.replace(' ', '_')}"] = {"median": round(1000 * statistics.median(measured), 2),
                                                         "min": round(1000 * min(measured), 2)}
        value = f"{1000 * statistics.median(measured):.1f} ms median, {1000 * min(measured):.1f} min"
        rows.append([f"step, {label}", value, f"{min(measured) / base:.2f}x (min)"])
    payload["batching"], batching_rows = _batching(gen, names, height, width, args.repeats)
    rows += batching_rows

    big = _adapters(folder, 2, GAP_RANK)
    modes = {"no loading": None, "loads back to back": _loader(gen, big, 0.0), "a load every 0.5 s": _loader(gen, big, 0.5)}
    gaps: dict[str, list[float]] = {mode: [] for mode in modes}
    loads: dict[str, list[float]] = {mode: [] for mode in modes}
    for round_ in range(2):  # interleaved, as above
        for mode, load in modes.items():
            requests = [_request(100 + i, height, width) for i in range(args.gap_jobs)]
            measured, loaded = _step_gap(gen.engine, requests, load)
            gaps[mode] += measured
            loads[mode] += loaded
    payload["step_gap"] = {"adapter_rank_loaded": GAP_RANK, **{
        mode: {"gap": _summary(gaps[mode]), "loads": _summary(loads[mode])} for mode in modes}}
    quiet = statistics.median(gaps["no loading"])
    for mode in modes:
        gap, load = _summary(gaps[mode]), _summary(loads[mode])
        what = f"{gap['median_ms']:.0f} ms median, {gap['p90_ms']:.0f} p90, {gap['max_ms']:.0f} max"
        if load["count"]:
            what += f"; {load['count']} loads of {load['median_ms']:.0f} ms median"
        rows.append([f"step gap, {mode}", what, f"{statistics.median(gaps[mode]) / quiet:.2f}x median"])
    print_table(["what", "value", "vs 0 adapters / no loading"], rows)
    write_json(f"lora-{args.size}-{args.device}.json", payload)


if __name__ == "__main__":
    main()
