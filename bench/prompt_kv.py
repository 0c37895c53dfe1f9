"""One Wan denoise step with the prompt's cross-attention K/V prepared once per request vs projected every step, CPU.

Wan2.1 1.3B block proportions (dim 1536, 12 heads, FFN 8960, UMT5 width 4096, 512 text tokens) with fewer blocks
(the saving per block does not depend on the count) and a small video grid, random weights. One step is the batched
CFG call (both branches, batch 2) the loop makes: `per-step` passes the embeddings (the text MLP and every block's
k/v projections run inside the call, as before), `prepared` passes `prepare_prompt`'s K/V, computed once outside
the timing (once per request). Settings alternate so machine load hits them alike; medians, their ratio and
os.getloadavg() before and after go to bench/results/prompt-kv-cpu.json.

    OMP_NUM_THREADS=2 python bench/prompt_kv.py [--layers 4] [--rounds 7] [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from vidloom.layers.prompt_kv import PromptKV  # noqa: E402
from vidloom.models.wan.transformer import WanTransformer  # noqa: E402
from vidloom.models.wan.transformer_config import WanTransformerConfig  # noqa: E402

TEXT_TOKENS = 512  # Wan's max_sequence_length
OUT = ROOT / "bench" / "results" / "prompt-kv-cpu.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--frames", type=int, default=3, help="latent frames (grid 3 x 15 x 26 = 1170 tokens)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    config = WanTransformerConfig(num_attention_heads=12, attention_head_dim=128, ffn_dim=8960, text_dim=4096,
                                  freq_dim=256, num_layers=args.layers)
    torch.manual_seed(0)
    dit = WanTransformer(config).eval().to(dtype)
    latents = torch.randn(2, 16, args.frames, 30, 52, dtype=dtype)
    timestep = torch.full((2,), 500.0)
    prompt, negative = (torch.randn(1, TEXT_TOKENS, 4096, dtype=dtype) for _ in range(2))
    load_before = os.getloadavg()
    with torch.inference_mode():
        started = time.perf_counter()
        prepared = [dit.prepare_prompt(prompt), dit.prepare_prompt(negative)]
        prepare_s = time.perf_counter() - started
        calls = {
            "per-step": lambda: dit(latents, timestep, torch.cat([prompt, negative])),
            "prepared": lambda: dit(latents, timestep, PromptKV.stack(prepared)),  # BatchedCFG stacks them per step
        }
        same = torch.allclose(calls["per-step"](), calls["prepared"](), atol=1e-5 if dtype == torch.float32 else 5e-2)
        times: dict[str, list[float]] = {name: [] for name in calls}
        for r in range(args.rounds):
            for name in list(calls) if r % 2 == 0 else list(calls)[::-1]:
                started = time.perf_counter()
                calls[name]()
                times[name].append(time.perf_counter() - started)
    medians = {name: statistics.median(t) for name, t in times.items()}
    result = {
        "config": {"dim": config.inner_dim, "heads": 12, "ffn_dim": 8960, "text_dim": 4096, "layers": args.layers,
                   "text_tokens": TEXT_TOKENS, "video_tokens": args.frames * 15 * 26, "batch": 2,
                   "dtype": args.dtype, "threads": torch.get_num_threads()},
        "median_step_s": medians, "speedup": medians["per-step"] / medians["prepared"],
        "prepare_once_s": prepare_s, "outputs_close": same, "times_s": times,
        "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "times_s"}, indent=2))


if __name__ == "__main__":
    main()
