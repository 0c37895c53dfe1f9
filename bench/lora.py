"""LoRA cost on a random Flux2 Klein: denoise step time with 0, 1 and 4 run-time adapters (rank 16 on every
block linear), and throughput of 8 concurrent requests (AsyncEngine policy "batch") with no adapters vs spread
over 4 adapters (runs with adapters step alone: grouped, not merged into one forward).

    OMP_NUM_THREADS=1 python bench/lora.py [--size tiny|mid] [--device cpu]
"""

from __future__ import annotations

import argparse
import statistics
import sys
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


def _adapters(folder: Path, count: int) -> list[Path]:
    out = CACHE / f"loras-{folder.name}"
    paths = [out / f"Flux2KleinPipeline-{seed}.safetensors" for seed in range(count)]
    for seed, path in enumerate(paths):
        if not path.exists():
            write_lora(folder, "Flux2KleinPipeline", LoRASpec(rank=RANK, alpha=RANK, targets=TARGETS, seed=seed,
                                                              std=0.02), out)
    return paths


def _step_times(engine, request) -> list[float]:
    run = engine.start(request)
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


def _throughput(engine, requests) -> float:
    from vidloom.runtime.async_engine import AsyncEngine

    async_engine = AsyncEngine(engine, policy="batch", slots=len(requests), queue_size=len(requests))
    try:
        started = time.perf_counter()
        for handle in [async_engine.submit(r) for r in requests]:
            handle.wait(600)
        return len(requests) / (time.perf_counter() - started)
    finally:
        async_engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=list(SIZES), default="mid")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    from dataclasses import replace

    from vidloom.generator import VideoGenerator

    folder = _checkpoint(args.size)
    _, height, width = SIZES[args.size]
    gen = VideoGenerator.from_pretrained(folder, device=args.device)
    names = []
    for i, path in enumerate(_adapters(folder, 4)):
        gen.load_lora(f"a{i}", path)
        names.append(f"a{i}")
    rows, payload = [], {"environment": environment(), "size": args.size, "rank": RANK, "steps": STEPS}
    base_ms = None
    for count in (0, 1, 4):
        loras = tuple((name, 0.5) for name in names[:count])
        _step_times(gen.engine, replace(_request(0, height, width), loras=loras))  # warm
        times = [t for _ in range(args.repeats)
                 for t in _step_times(gen.engine, replace(_request(0, height, width), loras=loras))]
        ms = 1000 * statistics.median(times)
        base_ms = base_ms or ms
        payload[f"step_ms_{count}_adapters"] = round(ms, 2)
        rows.append([f"step, {count} adapter(s)", f"{ms:.1f} ms", f"{ms / base_ms:.2f}x"])
    plain = [_request(i, height, width) for i in range(8)]
    mixed = [replace(r, loras=((names[i % 4], 0.5),)) for i, r in enumerate(plain)]
    for label, requests in (("8 requests, no adapters (batched)", plain), ("8 requests over 4 adapters (grouped)", mixed)):
        rate = _throughput(gen.engine, requests)
        payload[label] = round(rate, 3)
        rows.append([label, f"{rate:.2f} img/s", ""])
    print_table(["what", "value", "vs 0 adapters"], rows)
    write_json(f"lora-{args.size}-{args.device}.json", payload)


if __name__ == "__main__":
    main()
