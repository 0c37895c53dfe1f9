"""One Wan denoise step with the prompt's zero padding keys collapsed (layers.prompt_kv) vs all 512 kept, CPU.

The DiT of the side-by-side bench's wan2.1-mid (bench/checkpoints.py mid: 8 heads x 64, FFN 1536, 14 layers, text
width 64; 256 x 256 x 9 frames = 768 video tokens), random weights, float32. One step is the default (sequential)
CFG's two calls of batch 1, conditional then unconditional, each reading its prompt's prepared K/V: `full` keeps
every one of the 512 keys (prompt_key_multiple None: the layout before), `collapsed` the real tokens and the padding
key's copies up to a multiple of 16 with the log-count bias. The prompts have the real token counts of the bench's
prompt and negative prompt (`--tokens`; UMT5 rows are random, the padding zero as the pipeline pads them). Settings
alternate so machine load hits them alike; CPU seconds (process time) and wall seconds, medians, their ratio and
os.getloadavg() before and after go to bench/results/pad-keys-cpu.json.

    OMP_NUM_THREADS=1 python bench/pad_keys.py [--rounds 9] [--tokens 11 7] [--batched] [--ti2v]

`--batched`: one call of batch 2 (--cfg-mode batched: the two prompts stacked, the shorter padded with masked
filler), to pad-keys-batched-cpu.json.
`--ti2v`: wan2.2-ti2v-mid's DiT instead (bench/wan22.py TI2V_MID: 48 latent channels, 10 layers, 256 x 256 x 9
frames = 192 video tokens, per-token timesteps; its bench passes negative_prompt="", one real token), to
pad-keys-ti2v-cpu.json.
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

from vidloom.layers.prompt_kv import PADDING_KEY_MULTIPLE, PromptKV  # noqa: E402
from vidloom.models.wan.transformer import WanTransformer  # noqa: E402
from vidloom.models.wan.transformer_config import WanTransformerConfig  # noqa: E402

TEXT_TOKENS = 512  # Wan's max_sequence_length
OUT = ROOT / "bench" / "results" / "pad-keys-cpu.json"
OUT_TI2V = ROOT / "bench" / "results" / "pad-keys-ti2v-cpu.json"
OUT_BATCHED = ROOT / "bench" / "results" / "pad-keys-batched-cpu.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--tokens", type=int, nargs=2, default=[11, 7],
                        help="real tokens of the prompt and the negative prompt")
    parser.add_argument("--batched", action="store_true", help="one CFG call of batch 2 instead of two of batch 1")
    parser.add_argument("--ti2v", action="store_true", help="wan2.2-ti2v-mid's DiT and video tokens")
    args = parser.parse_args()
    channels, layers, side = (48, 10, 16) if args.ti2v else (16, 14, 32)
    config = WanTransformerConfig(num_attention_heads=8, attention_head_dim=64, ffn_dim=1536, text_dim=64,
                                  freq_dim=256, num_layers=layers, in_channels=channels, out_channels=channels)
    torch.manual_seed(0)
    dit = WanTransformer(config).eval()
    prompts = [_padded(tokens, config.text_dim) for tokens in args.tokens]
    latents = torch.randn(1, channels, 3, side, side)
    video_tokens = 3 * (side // 2) ** 2
    timestep = torch.full((1, video_tokens) if args.ti2v else (1,), 500.0)
    load_before = os.getloadavg()
    with torch.inference_mode():
        kv = {}
        for name, multiple in (("full", None), ("collapsed", PADDING_KEY_MULTIPLE)):
            dit.prompt_key_multiple = multiple
            kv[name] = [dit.prepare_prompt(p) for p in prompts]
        calls = {name: _step(dit, latents, timestep, pair, args.batched) for name, pair in kv.items()}
        reference, collapsed = calls["full"](), calls["collapsed"]()
        max_diff = float((reference - collapsed).abs().max())
        times = _alternate(calls, args.rounds)
    medians = {name: {clock: statistics.median(t[clock] for t in runs) for clock in ("cpu_s", "wall_s")}
               for name, runs in times.items()}
    result = {
        "config": {"dim": config.inner_dim, "heads": 8, "ffn_dim": 1536, "layers": layers,
                   "video_tokens": video_tokens,
                   "text_tokens": TEXT_TOKENS, "real_tokens": args.tokens, "batched_cfg": args.batched,
                   "kept_keys": [p.keys[0].shape[1] for p in kv["collapsed"]], "dtype": "float32",
                   "threads": torch.get_num_threads()},
        "median_step": medians,
        "speedup_cpu": medians["full"]["cpu_s"] / medians["collapsed"]["cpu_s"],
        "speedup_wall": medians["full"]["wall_s"] / medians["collapsed"]["wall_s"],
        "max_abs_diff": max_diff, "times": times,
        "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
    }
    out = OUT_TI2V if args.ti2v else OUT_BATCHED if args.batched else OUT
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "times"}, indent=2))


def _padded(tokens: int, width: int) -> torch.Tensor:
    """A prompt's UMT5 rows [1, 512, width] as the pipeline hands them over: `tokens` real rows, then zeros."""
    embeds = torch.zeros(1, TEXT_TOKENS, width)
    embeds[:, :tokens] = torch.randn(1, tokens, width)
    return embeds


def _step(dit: WanTransformer, latents: torch.Tensor, timestep: torch.Tensor, pair: list[PromptKV],
          batched: bool) -> Callable[[], torch.Tensor]:
    """One CFG step's DiT calls over the prepared prompt pair: the two predictions, stacked."""
    if batched:
        return lambda: dit(latents.repeat(2, 1, 1, 1, 1), timestep.repeat(2, *[1] * (timestep.ndim - 1)),
                           PromptKV.stack(pair))
    return lambda: torch.cat([dit(latents, timestep, kv) for kv in pair])


def _alternate(calls: dict[str, Callable[[], object]], rounds: int) -> dict[str, list[dict[str, float]]]:
    """CPU and wall seconds of each call per round, the order reversed every other round."""
    times: dict[str, list[dict[str, float]]] = {name: [] for name in calls}
    for r in range(rounds):
        for name in list(calls) if r % 2 == 0 else list(calls)[::-1]:
            cpu, wall = time.process_time(), time.perf_counter()
            calls[name]()
            times[name].append({"cpu_s": time.process_time() - cpu, "wall_s": time.perf_counter() - wall})
    return times


if __name__ == "__main__":
    main()
