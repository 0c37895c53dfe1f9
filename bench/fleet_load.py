"""Fleet benchmark: jobs/s and p50/p95 job latency through the Ray Serve ingress (1 and 2 replicas of the
demo model) against a single `vidloom serve` process (SQLite store, and PostgreSQL store).

Each setup runs two phases: one client submitting jobs one after another (the latency a job pays for
the fleet's extra hops: ingress, replica call, store polling), then C clients x M jobs (throughput).
Latency is submit -> the final status seen by polling GET /v1/videos/{id} every 20 ms, the same way
for every setup. Needs PostgreSQL server binaries (apt-get install postgresql) and ray[serve].

    OMP_NUM_THREADS=1 .venv/bin/python bench/fleet_load.py      # writes bench/results/fleet_load.json
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
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
RESULTS = Path(__file__).parent / "results" / "fleet_load.json"


def main() -> None:
    args = _parser().parse_args()
    from tests.helpers.postgres import PostgresServer, postgres_bin

    bin_dir = postgres_bin()
    if bin_dir is None:
        sys.exit("needs PostgreSQL server binaries: apt-get install postgresql")
    pg = PostgresServer(bin_dir)
    runs = []
    try:
        with tempfile.TemporaryDirectory(prefix="vidloom-fleet-bench-") as tmp:
            for store in ("sqlite", "postgresql"):
                url = None if store == "sqlite" else pg.new_database()
                with _ServeProcess(Path(tmp) / f"serve-{store}", url) as base:
                    runs.append({"setup": f"vidloom serve ({store})", **_measure(base, args)})
                    _print(runs[-1])
            runs.extend(_fleet_runs(Path(tmp), pg.new_database(), args))
    finally:
        pg.stop()
    report = {"config": vars(args), "machine": _machine(), "runs": runs, "fleet_overhead": _overhead(runs)}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report["fleet_overhead"], indent=2))
    print(f"wrote {RESULTS}")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sequential-jobs", type=int, default=8, help="jobs of the one-client phase")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--jobs-per-client", type=int, default=4)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--size", default="48x32")
    p.add_argument("--frames", type=int, default=5)
    p.add_argument("--port", type=int, default=18555, help="the fleet's HTTP port")
    p.add_argument("--time-limit", type=float, default=300.0, help="seconds per phase")
    return p


def _fleet_runs(tmp: Path, store_url: str, args: argparse.Namespace) -> list[dict]:
    import ray

    from vidloom.fleet.cli import start_fleet, stop_fleet
    from vidloom.fleet.config import load_fleet_card
    from vidloom.fleet.ray_app import deploy_replicas

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    runs = []
    server = None
    try:
        for replicas in (1, 2):
            card = tmp / f"fleet-{replicas}.yaml"
            card.write_text(f"store: {store_url}\ndata_dir: {tmp / 'fleet-data'}\nport: {args.port}\nqueue_size: 64\n"
                            f"fleet:\n  num_cpus: 4\n  object_store_mb: 100\n  models:\n"
                            f"    - {{model: wan2.1-demo, replicas: {replicas}, num_cpus: 1, device: cpu}}\n")
            if server is None:
                server = start_fleet(load_fleet_card(card), log_level="warning")
            else:
                deploy_replicas(load_fleet_card(card))  # redeploys the model with 2 replicas
            _wait_replicas(server.url, replicas)
            runs.append({"setup": f"ray fleet, {replicas} replica(s)", **_measure(server.url, args)})
            _print(runs[-1])
    finally:
        if server is not None:
            stop_fleet(server)
        ray.shutdown()
    return runs


def _wait_replicas(url: str, count: int, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=5).json()["models"]["wan2.1-demo"] == count:
                return
        except (httpx.HTTPError, KeyError, ValueError):
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{count} replicas not live after {timeout}s")


def _measure(url: str, args: argparse.Namespace) -> dict:
    _run(url, args, clients=1, jobs=1)  # warm-up: first-request costs are not the fleet's
    sequential = _run(url, args, clients=1, jobs=args.sequential_jobs)
    concurrent = _run(url, args, clients=args.clients, jobs=args.jobs_per_client)
    return {"url": url, "sequential": sequential, "concurrent": concurrent}


def _run(url: str, args: argparse.Namespace, clients: int, jobs: int) -> dict:
    latencies: list[float] = []
    failures: list[str] = []
    lock = threading.Lock()
    deadline = time.monotonic() + args.time_limit

    def client() -> None:
        with httpx.Client(base_url=url, timeout=60) as http:
            for _ in range(jobs):
                status, seconds = _one_job(http, args, deadline)
                with lock:
                    (latencies.append(seconds) if status == "completed" else failures.append(status))

    started = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    return {"clients": clients, "jobs": clients * jobs, "completed": len(latencies), "failures": failures,
            "wall_s": round(wall, 3), "jobs_per_s": round(len(latencies) / wall, 3), **_percentiles(latencies)}


def _one_job(http: httpx.Client, args: argparse.Namespace, deadline: float) -> tuple[str, float]:
    body = {"prompt": "a cat walks on the beach", "size": args.size, "num_frames": args.frames,
            "num_inference_steps": args.steps, "seed": 0}
    started = time.perf_counter()
    created = http.post("/v1/videos", json=body)
    if created.status_code != 200:
        return f"http_{created.status_code}", 0.0
    job = created.json()["id"]
    while time.monotonic() < deadline:
        status = http.get(f"/v1/videos/{job}").json()["status"]
        if status in ("completed", "failed", "cancelled"):
            return status, time.perf_counter() - started
        time.sleep(0.02)
    return "timeout", 0.0


def _percentiles(values: list[float]) -> dict:
    if not values:
        return {"p50_s": None, "p95_s": None}
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {"p50_s": round(statistics.median(ordered), 3), "p95_s": round(p95, 3)}


def _overhead(runs: list[dict]) -> dict:
    """Per-job latency the fleet adds (1 replica, one client) over `vidloom serve` on the same store kind."""
    by = {r["setup"]: r for r in runs}
    base, fleet = by.get("vidloom serve (postgresql)"), by.get("ray fleet, 1 replica(s)")
    if not base or not fleet or base["sequential"]["p50_s"] is None or fleet["sequential"]["p50_s"] is None:
        return {}
    added = fleet["sequential"]["p50_s"] - base["sequential"]["p50_s"]
    return {"p50_added_s": round(added, 3), "p50_added_fraction": round(added / base["sequential"]["p50_s"], 3)}


class _ServeProcess:
    """`vidloom serve` in a subprocess (its own data dir, SQLite or the given PostgreSQL store)."""

    def __init__(self, data: Path, store: str | None) -> None:
        self.data, self.store = data, store

    def __enter__(self) -> str:
        self.data.mkdir(parents=True)
        log = self.data / "serve.log"
        cmd = [sys.executable, "-m", "vidloom.cli", "serve", "--port", "0", "--data-dir", str(self.data / "d"),
               "--queue-size", "64", "--device", "cpu", *(["--store", self.store] if self.store else [])]
        self.proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and self.proc.poll() is None:
            match = re.search(r"on (http://127\.0\.0\.1:\d+)", log.read_text())
            if match:
                return match.group(1)
            time.sleep(0.1)
        raise RuntimeError(f"server did not start:\n{log.read_text()}")

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.wait(60)


def _print(run: dict) -> None:
    s, c = run["sequential"], run["concurrent"]
    print(f"{run['setup']:<28} one client: p50 {s['p50_s']} s p95 {s['p95_s']} s | {c['clients']} clients: "
          f"{c['jobs_per_s']} jobs/s p50 {c['p50_s']} s p95 {c['p95_s']} s failures {len(c['failures'])}", flush=True)


def _machine() -> dict:
    return {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "loadavg": os.getloadavg()}


if __name__ == "__main__":
    main()
