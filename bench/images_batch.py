"""Images per second with 1, 4 and 8 concurrent clients, AsyncEngine `fifo` vs `batch`, on a random Flux2 Klein
checkpoint; p50/p95 latency; and vidloom vs diffusers single-image wall time, all in one run.

Clients are threads that each submit one image request, wait for it, and submit the next
(closed loop), straight to the AsyncEngine (no HTTP: this measures the device side). Every
request has its own seed and prompt; step counts are equal (the distilled model's 4).

    OMP_NUM_THREADS=1 python bench/images_batch.py [--size tiny|mid|large] [--images-per-client 3] [--device cuda]

On a shared CPU run it with OMP_NUM_THREADS=1: with 2 threads on a loaded 2-core machine,
OpenMP's spinning made one tiny image take 3-13 s instead of 0.3 s.
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

from checkpoints import cached  # noqa: E402
from report import environment, print_table, write_json  # noqa: E402
from tests.helpers.flux2_checkpoints import (  # noqa: E402
    TINY_DISTILLED, TinyFlux2, flux2_dit, flux2_vae, write_tiny_flux2,
)

SIZES = {
    "tiny": (TINY_DISTILLED, 32, 48),
    # A mid-size Klein-shaped model: 256-wide DiT (2 double + 4 single blocks), 4-level VAE, 128x128 images.
    "mid": (TinyFlux2(
        name="klein-mid",
        distilled=True,
        transformer=flux2_dit(in_channels=64, layers=2, single_layers=4, head_dim=64, heads=4, text_width=192,
                              time_channels=256, rope_axis=16),
        vae=flux2_vae(channels=(32, 64, 64, 64), latent_channels=16, groups=16),
        text_hidden=64,
    ), 128, 128),
    # Larger: what a GPU needs before batching has anything to share (1024-wide DiT, 256x256 images).
    "large": (TinyFlux2(
        name="klein-large",
        distilled=True,
        transformer=flux2_dit(in_channels=128, layers=4, single_layers=8, head_dim=128, heads=8, text_width=768,
                              time_channels=256, rope_axis=32),
        vae=flux2_vae(channels=(64, 128, 128, 128), latent_channels=32, groups=32),
        text_hidden=256,
    ), 256, 256),
}
CLIENTS = (1, 4, 8)
STEPS = 4


def _checkpoint(size: str) -> Path:
    spec = SIZES[size][0]
    return cached(f"flux2-{spec.name}", lambda folder: write_tiny_flux2(folder, spec))


def _load(folder: Path, device: str):
    from vidloom.generator import VideoGenerator

    return VideoGenerator.from_pretrained(folder, device=device).engine


def _request(i: int, height: int, width: int):
    from vidloom.core.request import GenerationRequest, Task

    return GenerationRequest(prompt=f"a red fox number {i} in the snow", task=Task.T2I, height=height, width=width,
                             num_inference_steps=STEPS, seed=i)


def _load_run(engine, policy: str, clients: int, per_client: int, height: int, width: int) -> dict:
    from vidloom.runtime.async_engine import AsyncEngine

    slots = 1 if policy == "fifo" else clients
    async_engine = AsyncEngine(engine, policy=policy, slots=slots, queue_size=64)
    latencies: list[float] = []
    lock = threading.Lock()

    def client(c: int) -> None:
        for j in range(per_client):
            started = time.perf_counter()
            async_engine.submit(_request(1000 * c + j, height, width)).wait(600)
            with lock:
                latencies.append(time.perf_counter() - started)

    started, cpu_started = time.perf_counter(), time.process_time()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    stats = async_engine.batch_stats
    async_engine.close()
    latencies.sort()
    return {
        "policy": policy, "clients": clients, "images": len(latencies), "wall_s": round(wall, 3),
        "images_per_s": round(len(latencies) / wall, 3),
        # CPU seconds of this process: on a shared machine, far steadier than wall time.
        "cpu_s": round(cpu, 3), "images_per_cpu_s": round(len(latencies) / cpu, 3),
        "p50_s": round(statistics.median(latencies), 3),
        "p95_s": round(latencies[min(len(latencies) - 1, int(0.95 * len(latencies)))], 3),
        "mean_batch": stats["mean_batch"] if policy == "batch" else 1.0,
    }


def _single_image(engine, folder: Path, device: str, height: int, width: int, runs: int) -> dict:
    """Median wall time of one image (text, denoise, decode): vidloom's Engine vs Flux2KleinPipeline."""
    from diffusers import Flux2KleinPipeline

    pipe = Flux2KleinPipeline.from_pretrained(str(folder), dtype=engine.instance.dtype).to(device)
    pipe.set_progress_bar_config(disable=True)

    def ours(i: int) -> None:
        engine.run(_request(i, height, width))

    def theirs(i: int) -> None:
        pipe(prompt=f"a red fox number {i} in the snow", height=height, width=width, num_inference_steps=STEPS,
             generator=torch.Generator("cpu").manual_seed(i), output_type="np")

    times: dict[str, list[float]] = {"vidloom": [], "diffusers": []}
    cpu: dict[str, list[float]] = {"vidloom": [], "diffusers": []}
    for fn in (ours, theirs):
        fn(0)  # warm-up
    for i in range(runs):  # alternate, so drifting machine load hits both alike
        for name, fn in (("vidloom", ours), ("diffusers", theirs)):
            _sync(device)
            started, cpu_started = time.perf_counter(), time.process_time()
            fn(i + 1)
            _sync(device)
            times[name].append(time.perf_counter() - started)
            cpu[name].append(time.process_time() - cpu_started)
    med = {k: statistics.median(v) for k, v in times.items()}
    med_cpu = {k: statistics.median(v) for k, v in cpu.items()}
    return {"vidloom_s": round(med["vidloom"], 4), "diffusers_s": round(med["diffusers"], 4),
            "ratio_vidloom_over_diffusers": round(med["vidloom"] / med["diffusers"], 3),
            "vidloom_cpu_s": round(med_cpu["vidloom"], 4), "diffusers_cpu_s": round(med_cpu["diffusers"], 4),
            "cpu_ratio_vidloom_over_diffusers": round(med_cpu["vidloom"] / med_cpu["diffusers"], 3), "runs": runs}


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="mid", choices=sorted(SIZES))
    parser.add_argument("--images-per-client", type=int, default=3)
    parser.add_argument("--single-runs", type=int, default=3)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", default=None, help="results file name (default: images_batch-<size>-<device>.json)")
    args = parser.parse_args()
    folder = _checkpoint(args.size)
    _, height, width = SIZES[args.size]
    engine = _load(folder, args.device)
    engine.run(_request(0, height, width))  # warm-up
    runs = []
    for clients in CLIENTS:
        for policy in ("fifo", "batch"):
            runs.append(_load_run(engine, policy, clients, args.images_per_client, height, width))
            print(runs[-1], flush=True)
    ratios, cpu_ratios = {}, {}
    for clients in CLIENTS:
        fifo, batch = (next(r for r in runs if r["policy"] == p and r["clients"] == clients) for p in ("fifo", "batch"))
        ratios[str(clients)] = round(batch["images_per_s"] / fifo["images_per_s"], 3)
        cpu_ratios[str(clients)] = round(batch["images_per_cpu_s"] / fifo["images_per_cpu_s"], 3)
    single = _single_image(engine, folder, args.device, height, width, args.single_runs)
    print_table(["policy", "clients", "images/s", "images/cpu-s", "p50 s", "p95 s", "mean batch"],
                [[r["policy"], str(r["clients"]), f"{r['images_per_s']:.2f}", f"{r['images_per_cpu_s']:.2f}",
                  f"{r['p50_s']:.2f}",
                  f"{r['p95_s']:.2f}", f"{r['mean_batch']:.2f}"] for r in runs])
    print(f"throughput batch/fifo by clients: wall {ratios}, per CPU second {cpu_ratios}")
    print(f"single image: vidloom {single['vidloom_s']}s, diffusers {single['diffusers_s']}s, "
          f"ratio {single['ratio_vidloom_over_diffusers']} (CPU time ratio {single['cpu_ratio_vidloom_over_diffusers']})")
    payload = {"environment": environment(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "size": args.size, "height": height, "width": width, "steps": STEPS,
               "device": args.device, "runs": runs, "throughput_ratio_batch_over_fifo": ratios,
               "cpu_throughput_ratio_batch_over_fifo": cpu_ratios,
               "single_image": single}
    write_json(args.out or f"images_batch-{args.size}-{args.device.split(':')[0]}.json", payload)


if __name__ == "__main__":
    main()
