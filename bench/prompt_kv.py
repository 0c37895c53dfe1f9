"""One Wan denoise step with the prompt's cross-attention K/V prepared once per request vs projected every step, CPU.

Wan2.1 1.3B block proportions (dim 1536, 12 heads, FFN 8960, UMT5 width 4096, 512 text tokens) with fewer blocks
(the saving per block does not depend on the count) and a small video grid, random weights. One step is the batched
CFG call (both branches, batch 2) the loop makes: `per-step` passes the embeddings (the text MLP and every block's
k/v projections run inside the call, as before), `prepared` passes `prepare_prompt`'s K/V, computed once outside
the timing (once per request). Settings alternate so machine load hits them alike; medians, their ratio and
os.getloadavg() before and after go to bench/results/prompt-kv-cpu.json.

    OMP_NUM_THREADS=2 python bench/prompt_kv.py [--layers 4] [--rounds 7] [--dtype bfloat16]

`--i2v` makes it a Wan2.1 I2V DiT (CLIP ViT-H width 1280, 257 image tokens, the image K/V projections in every
block) and times three settings of the same step: `per-step` (prompt and image projected in the call), `text-prepared`
(the prompt prepared, the image projected: before the image K/V were prepared) and `prepared` (both prepared once),
plus the image projections alone (what a step no longer runs); to bench/results/prompt-kv-i2v-cpu.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from vidloom.families.wan.conditioning import ImageConditionedNetwork  # noqa: E402
from vidloom.layers.prompt_kv import PromptKV  # noqa: E402
from vidloom.models.wan.transformer import WanTransformer  # noqa: E402
from vidloom.models.wan.transformer_config import WanTransformerConfig  # noqa: E402

TEXT_TOKENS = 512  # Wan's max_sequence_length
IMAGE_TOKENS, IMAGE_DIM = 257, 1280  # Wan2.1 I2V's CLIP ViT-H/14 at 224 px: 16 x 16 patches + CLS, width 1280
OUT = ROOT / "bench" / "results" / "prompt-kv-cpu.json"
OUT_I2V = ROOT / "bench" / "results" / "prompt-kv-i2v-cpu.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--frames", type=int, default=3, help="latent frames (grid 3 x 15 x 26 = 1170 tokens)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--i2v", action="store_true", help="a Wan2.1 I2V DiT: the CLIP image K/V prepared too")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    image = {"image_dim": IMAGE_DIM, "added_kv_proj_dim": 1536} if args.i2v else {}
    config = WanTransformerConfig(num_attention_heads=12, attention_head_dim=128, ffn_dim=8960, text_dim=4096,
                                  freq_dim=256, num_layers=args.layers, **image)
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
        if args.i2v:
            calls, extra = _i2v_calls(dit, latents, timestep, torch.cat([prompt, negative]), prepared)
        else:
            calls, extra = {
                "per-step": lambda: dit(latents, timestep, torch.cat([prompt, negative])),
                "prepared": lambda: dit(latents, timestep, PromptKV.stack(prepared)),  # BatchedCFG stacks per step
            }, {}
        same = torch.allclose(calls["per-step"](), calls["prepared"](), atol=1e-5 if dtype == torch.float32 else 5e-2)
        times = _alternate(calls, args.rounds)
    medians = {name: statistics.median(t) for name, t in times.items()}
    result = {
        "config": {"dim": config.inner_dim, "heads": 12, "ffn_dim": 8960, "text_dim": 4096, "layers": args.layers,
                   "text_tokens": TEXT_TOKENS, "video_tokens": args.frames * 15 * 26, "batch": 2,
                   "image_tokens": IMAGE_TOKENS if args.i2v else 0, "dtype": args.dtype,
                   "threads": torch.get_num_threads()},
        "median_step_s": medians, "speedup": medians["per-step"] / medians["prepared"],
        "prepare_once_s": prepare_s, "outputs_close": same, **extra, "times_s": times,
        "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
    }
    out = OUT_I2V if args.i2v else OUT
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "times_s"}, indent=2))


def _i2v_calls(dit: WanTransformer, latents: torch.Tensor, timestep: torch.Tensor, text: torch.Tensor,
               prepared: list[PromptKV]) -> tuple[dict[str, Callable[[], torch.Tensor]], dict[str, float]]:
    """The three I2V settings of one batched-CFG step, and the image projections' own time (median of 5)."""
    view = ImageConditionedNetwork(dit, torch.randn(1, IMAGE_TOKENS, IMAGE_DIM, dtype=latents.dtype))
    started = time.perf_counter()
    with_image = view.prepare_network()
    prepare_image_s = time.perf_counter() - started
    assert with_image is not None
    rows = view.image_embeds.repeat(2, 1, 1)  # what a per-step batched call projects: the tokens of both rows
    projections = _alternate({"image": lambda: dit.prepare_image(rows)}, 5)["image"]
    return {
        "per-step": lambda: view(latents, timestep, text),
        "text-prepared": lambda: view(latents, timestep, PromptKV.stack(prepared)),
        "prepared": lambda: with_image(latents, timestep, PromptKV.stack(prepared)),
    }, {"prepare_image_once_s": prepare_image_s, "image_projections_per_step_s": statistics.median(projections)}


def _alternate(calls: dict[str, Callable[[], object]], rounds: int) -> dict[str, list[float]]:
    """Seconds of each call per round, the order reversed every other round so machine load hits them alike."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    for r in range(rounds):
        for name in list(calls) if r % 2 == 0 else list(calls)[::-1]:
            started = time.perf_counter()
            calls[name]()
            times[name].append(time.perf_counter() - started)
    return times


if __name__ == "__main__":
    main()
