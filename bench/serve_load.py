"""Load benchmark for `vidloom serve`: concurrent clients, job latency and /health latency, per policy.

Starts a server subprocess on 127.0.0.1 for each policy (or uses --url), runs N clients x M
jobs (a mix of short and long step counts), and prints throughput, p50/p95 job latency
(all, short, long) and /health latency while jobs run. Bounded in job count and time.

    .venv/bin/python bench/serve_load.py                 # fifo (1 slot) and interleave (2 slots)
    .venv/bin/python bench/serve_load.py --url http://127.0.0.1:8000 --clients 2
    .venv/bin/python bench/serve_load.py --abuse         # fifo: a clean run, then the same load with abusers

With --abuse (see bench/serve_abuse.py) the normal jobs' p95 and /health p99 of the abused run
are compared with the clean run on the same server, and the server's RSS before and after, with its
peak (VmHWM) after the clean run and after the abused one: abuse may add at most ABUSE_PEAK_BUDGET_MIB.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

RESULTS = Path(__file__).parent / "results" / "serve_load.json"
POLICIES = (("fifo", 1), ("interleave", 2))
ABUSE_PEAK_BUDGET_MIB = 300  # issue #21: abusive clients may raise the server's peak RSS this much at most


@dataclass(frozen=True)
class JobResult:
    steps: int
    latency_s: float
    status: str


def main() -> None:
    args = _parser().parse_args()
    if args.abuse:
        return _abuse_main(args)
    runs = []
    for policy, slots in POLICIES if args.url is None else (("external", 0),):
        with _Server(args, policy, slots) as url:
            print(f"== {policy} (slots={slots}) at {url}", flush=True)
            runs.append({"policy": policy, "slots": slots, **_run_load(url, args)})
            _print_run(runs[-1])
    report = {"config": vars(args), "machine": _machine(), "runs": runs}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {RESULTS}")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default=None, help="use a running server instead of starting one per policy")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--jobs-per-client", type=int, default=3)
    p.add_argument("--short-steps", type=int, default=2)
    # The demo VAE decode (~0.7 s here) dwarfs a denoise step (~12 ms), so "long" needs many steps to differ.
    p.add_argument("--long-steps", type=int, default=64)
    p.add_argument("--size", default="64x48")
    p.add_argument("--frames", type=int, default=9)
    p.add_argument("--health-interval", type=float, default=0.05)
    p.add_argument("--time-limit", type=float, default=300.0, help="give up on a run after this many seconds")
    p.add_argument("--abuse", action="store_true", help="fifo only: clean run, then the same with abusive clients")
    return p


def _abuse_main(args: argparse.Namespace) -> None:
    from serve_abuse import AbuseProcess  # bench/ is run as a script directory

    with _Server(args, "fifo", 1) as url:
        pid = _server_pid(url)
        rss = {"start_mib": _rss_mib(pid)}
        clean = _run_load(url, args)
        rss["after_clean_mib"] = _rss_mib(pid)
        rss["peak_clean_mib"] = _rss_mib(pid, "VmHWM")
        with AbuseProcess(url, args.long_steps) as mix:
            abused = _run_load(url, args)
        rss["after_abuse_mib"] = _rss_mib(pid)
        rss["peak_abused_mib"] = _rss_mib(pid, "VmHWM")
        time.sleep(2)
        rss["settled_mib"] = _rss_mib(pid)
    if rss["peak_clean_mib"] is not None and rss["peak_abused_mib"] is not None:
        rss["peak_over_clean_mib"] = round(rss["peak_abused_mib"] - rss["peak_clean_mib"], 1)
        rss["peak_within_budget"] = rss["peak_over_clean_mib"] <= ABUSE_PEAK_BUDGET_MIB
    ratios = {
        "job_p95": _ratio(abused["latency_s"]["p95"], clean["latency_s"]["p95"]),
        "health_p99": _ratio(abused["health_latency_s"]["p99"], clean["health_latency_s"]["p99"]),
    }
    report = {"config": vars(args), "machine": _machine(), "clean": clean, "abused": abused,
              "abuse_outcomes": dict(sorted(mix.counts.items())), "abused_over_clean": ratios, "server_rss": rss}
    for name, run in (("clean", clean), ("abused", abused)):
        print(f"== {name}")
        _print_run(run)
    print(f"abused/clean: {ratios}\nserver RSS: {rss}\nabusers: {report['abuse_outcomes']}")
    path = RESULTS.with_name("serve_abuse.json")
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {path}")


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else round(a / b, 2)


def _server_pid(url: str) -> int | None:
    return _Server.pids.get(url)


def _rss_mib(pid: int | None, field: str = "VmRSS") -> float | None:
    """The process's resident memory now (VmRSS) or its peak so far (VmHWM), in MiB."""
    if pid is None:
        return None
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return round(int(line.split()[1]) / 1024, 1)
    return None


def _run_load(url: str, args: argparse.Namespace) -> dict:
    deadline = time.monotonic() + args.time_limit
    results: list[JobResult] = []
    lock = threading.Lock()
    busy = threading.Event()
    health: list[float] = []
    busy.set()
    poller = threading.Thread(target=_poll_health, args=(url, busy, health, args.health_interval, deadline))
    poller.start()

    def client(index: int) -> None:
        with httpx.Client(base_url=url, timeout=args.time_limit) as http:
            for job in range(args.jobs_per_client):
                steps = args.short_steps if (index + job) % 2 == 0 else args.long_steps
                result = _one_job(http, steps, args, deadline)
                with lock:
                    results.append(result)

    started = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    busy.clear()
    poller.join()
    return _summary(results, health, wall, args)


def _one_job(http: httpx.Client, steps: int, args: argparse.Namespace, deadline: float) -> JobResult:
    """Submit, then follow the job's SSE stream to its final event; latency is submit -> final event."""
    body = {"prompt": "a cat walks on the beach", "size": args.size, "num_frames": args.frames,
            "num_inference_steps": steps, "seed": 0}
    started = time.perf_counter()
    created = http.post("/v1/videos", json=body)
    if created.status_code != 200:
        return JobResult(steps, time.perf_counter() - started, f"http_{created.status_code}")
    final = "timeout"
    with http.stream("GET", f"/v1/videos/{created.json()['id']}/events",
                     timeout=max(1.0, deadline - time.monotonic())) as stream:
        for line in stream.iter_lines():
            if line.startswith("event:") and line.split(":", 1)[1].strip() != "progress":
                final = line.split(":", 1)[1].strip()
    return JobResult(steps, time.perf_counter() - started, final)


def _poll_health(url: str, busy: threading.Event, out: list[float], interval: float, deadline: float) -> None:
    with httpx.Client(base_url=url, timeout=10) as http:
        while busy.is_set() and time.monotonic() < deadline:
            started = time.perf_counter()
            http.get("/health").raise_for_status()
            out.append(time.perf_counter() - started)
            time.sleep(interval)


def _summary(results: list[JobResult], health: list[float], wall: float, args: argparse.Namespace) -> dict:
    done = [r for r in results if r.status == "completed"]

    def pct(values: list[float]) -> dict:
        if not values:
            return {"p50": None, "p95": None, "p99": None}
        values = sorted(values)
        def at(q: float) -> float:
            return round(values[min(len(values) - 1, int(q * len(values)))], 4)

        return {"p50": round(statistics.median(values), 4), "p95": at(0.95), "p99": at(0.99)}

    return {
        "jobs": len(results), "completed": len(done), "wall_s": round(wall, 3),
        "throughput_jobs_per_s": round(len(done) / wall, 3),
        "latency_s": pct([r.latency_s for r in done]),
        "short_latency_s": pct([r.latency_s for r in done if r.steps == args.short_steps]),
        "long_latency_s": pct([r.latency_s for r in done if r.steps == args.long_steps]),
        "health_latency_s": {**pct(health), "max": round(max(health), 4) if health else None, "samples": len(health)},
        "failed": sorted({r.status for r in results} - {"completed"}),
    }


def _print_run(run: dict) -> None:
    print(f"  {run['completed']}/{run['jobs']} jobs in {run['wall_s']}s = {run['throughput_jobs_per_s']} jobs/s")
    for key in ("latency_s", "short_latency_s", "long_latency_s", "health_latency_s"):
        print(f"  {key:<17} p50 {run[key]['p50']}  p95 {run[key]['p95']}")


class _Server:
    """A `vidloom serve` subprocess for one policy (or the --url server), stopped on exit."""

    pids: dict[str, int] = {}  # url -> server pid, for RSS readings

    def __init__(self, args: argparse.Namespace, policy: str, slots: int) -> None:
        self.args, self.policy, self.slots = args, policy, slots
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> str:
        if self.args.url:
            return self.args.url
        self.tmp = tempfile.TemporaryDirectory(prefix="vidloom-bench-")
        log = Path(self.tmp.name) / "server.log"
        cmd = [sys.executable, "-m", "vidloom.cli", "serve", "--port", "0", "--data-dir", f"{self.tmp.name}/data",
               "--policy", self.policy, "--slots", str(self.slots), "--queue-size", "32", "--device", "cpu"]
        self.proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and self.proc.poll() is None:
            match = re.search(r"on (http://127\.0\.0\.1:\d+)", log.read_text())
            if match and _healthy(match.group(1)):
                _Server.pids[match.group(1)] = self.proc.pid
                return match.group(1)
            time.sleep(0.1)
        raise RuntimeError(f"server did not start:\n{log.read_text()}")

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(60)
            self.tmp.cleanup()


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def _machine() -> dict:
    import torch

    return {"python": platform.python_version(), "torch": torch.__version__, "cpus": os.cpu_count(),
            "device": "cuda" if torch.cuda.is_available() else "cpu"}


if __name__ == "__main__":
    main()
