"""AnyFlow-FAR cross-request batching: N requests' rollout steps at the same chunk, alone vs one batched forward.

One random-weight FarTransformer of far_rollout.py's MID shape (no checkpoint: the step's cost does not depend on the
weights), N requests with CFG (two text rows each), each with its own KV slab prefilled with a random context of the
chunk's layout. Per N, best of --repeats, the three alternating:

- alone: the N steps one after another (what the batch policy did before FAR declared its steps);
- batched: runtime.batching.run_batched over the N plans, each request's queries attending to its own slab
  (network.FarKVStack, one attention call per request inside the shared forward);
- batched, concatenated KV: the same forward with the N slabs' K/V copied into one tensor per layer and one
  attention call (the alternative FarKVStack's docstring weighs).

Batched outputs are checked against the alone ones (max abs difference recorded). The load average is recorded per
row: on a shared machine the ratios move with it. Results: bench/results/far_batching-<size>-cpu.json.

    OMP_NUM_THREADS=1 python bench/far_batching.py [--size 256] [--chunk 3] [--requests 1,2,3,4] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from far_rollout import MID  # noqa: E402
from report import environment, print_table, write_json  # noqa: E402
from vidloom.core.loop import NETWORK, StepPlan  # noqa: E402
from vidloom.families.wan_causal.config import FarTransformerConfig  # noqa: E402
from vidloom.families.wan_causal.kv_cache import FarKVStack  # noqa: E402
from vidloom.families.wan_causal.layout import ChunkLayout  # noqa: E402
from vidloom.families.wan_causal.loop import FAR_STEP_INPUTS, STEP, far_prefill, far_step  # noqa: E402
from vidloom.families.wan_causal.network import FarNetwork  # noqa: E402
from vidloom.families.wan_causal.transformer import FarTransformer  # noqa: E402
from vidloom.runtime.batching import run_batched  # noqa: E402

TEXT_TOKENS = 64


def _plans(model: FarTransformer, n: int, size: int, chunk: int) -> list[StepPlan]:
    """n requests' rollout steps at `chunk`, each slab prefilled with its own random context."""
    config = model.config
    latent = (config.wan.in_channels, size // 8, size // 8)
    layout = ChunkLayout.for_chunk(config.chunk_partition, chunk, latent[1:], config)
    plans = []
    for i in range(n):
        text = model.embed_text(torch.randn(2, TEXT_TOKENS, config.wan.text_dim))
        cache = model.new_cache([layout], 2, torch.device("cpu"), torch.float32)
        if layout.context_frames:
            far_prefill(model, torch.randn(1, latent[0], layout.context_frames, *latent[1:]), text, layout, cache)
        inputs = {NETWORK: FarNetwork(model, layout, cache, chunk),
                  "latents": torch.randn(1, latent[0], layout.generated_frames, *latent[1:]),
                  "t": torch.tensor([0.9 - 0.1 * i]), "r": torch.tensor([0.4]), "text": text,
                  "guidance_scale": 3.0 + 0.5 * i, "pair": None}
        plans.append(StepPlan(loop=STEP, index=0, total=1, call=far_step, inputs=inputs, denoiser=FAR_STEP_INPUTS))
    return plans


def _concatenated(self: FarKVStack, layer: int, start: int, null_keys: int, q: Any, k: Any, v: Any, attend: Any) -> Any:
    """FarKVStack.step_attention with the slabs' K/V copied into one tensor and one attention call."""
    n = len(self.caches)
    for i, cache in enumerate(self.caches):
        cache.write(layer, start, k[i::n], v[i::n])
    reads = [cache.read(layer, null_keys, start + k.shape[1]) for cache in self.caches]
    keys = torch.stack([r[0] for r in reads], dim=1).flatten(0, 1)
    values = torch.stack([r[1] for r in reads], dim=1).flatten(0, 1)
    return attend(q, keys, values)


def _modes(plans: list[StepPlan]) -> dict[str, Any]:
    per_request = FarKVStack.step_attention

    def concatenated() -> list[Any]:
        FarKVStack.step_attention = _concatenated  # type: ignore[method-assign]
        try:
            return run_batched(plans)
        finally:
            FarKVStack.step_attention = per_request  # type: ignore[method-assign]

    return {"alone": lambda: [p.call(**p.inputs) for p in plans], "batched": lambda: run_batched(plans),
            "batched_concat_kv": concatenated}


def measure(model: FarTransformer, n: int, size: int, chunk: int, repeats: int) -> dict[str, Any]:
    """Best wall and CPU seconds per mode (with one torch thread CPU time is the work itself; wall time also counts
    the waits for a core that other processes hold)."""
    plans = _plans(model, n, size, chunk)
    modes = _modes(plans)
    best = {name: float("inf") for name in modes}
    cpu = dict(best)
    outputs: dict[str, list[Any]] = {}
    load = os.getloadavg()[0]
    with torch.inference_mode():
        for name, run in modes.items():
            outputs[name] = run()  # warm-up, and the outputs compared below
        for _ in range(repeats):
            for name, run in modes.items():
                started, cpu_started = time.perf_counter(), time.process_time()
                run()
                best[name] = min(best[name], time.perf_counter() - started)
                cpu[name] = min(cpu[name], time.process_time() - cpu_started)
    diff = max(float((b - a).abs().max()) for mode in ("batched", "batched_concat_kv")
               for a, b in zip(outputs["alone"], outputs[mode]))
    layout = plans[0].inputs[NETWORK].layout
    return {"requests": n, "context_tokens": layout.context_tokens, "chunk_tokens": layout.generated_tokens,
            **{f"{name}_s": round(s, 4) for name, s in best.items()},
            **{f"{name}_cpu_s": round(s, 4) for name, s in cpu.items()},
            "alone_over_batched_cpu": round(cpu["alone"] / cpu["batched"], 2),
            "concat_over_per_request_cpu": round(cpu["batched_concat_kv"] / cpu["batched"], 3),
            "max_abs_diff_vs_alone": diff, "loadavg_1m_at_start": round(load, 2)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=256, help="frame height and width in pixels")
    parser.add_argument("--chunk", type=int, default=3, help="which chunk's steps (0 attends to no context)")
    parser.add_argument("--requests", default="1,2,3,4")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--output", default=None, help="JSON name under bench/results (default from --size)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = FarTransformer(FarTransformerConfig.from_diffusers(MID.transformer)).eval()
    rows = [measure(model, int(n), args.size, args.chunk, args.repeats) for n in args.requests.split(",")]
    print_table(list(rows[0]), [list(r.values()) for r in rows])
    payload = {"bench": "far_batching", "model": MID.name, "size": args.size, "chunk": args.chunk,
               "threads": args.threads, "environment": environment(), "rows": rows}
    write_json(args.output or f"far_batching-{args.size}-cpu.json", payload)
    return payload


if __name__ == "__main__":
    main()
