"""The fused Linear + tanh-GELU (vidloom.layers.fused_linear) in the MLPs that took it last: off against on.

SANA-WM's MLP (its caption projection; the block FFN when ffn_type is "mlp"), HunyuanVideo-1.5's dual-stream block
and its MLP, the Qwen-Omni speech DiT's block, LTX-2's caption projection, each at the mid-size bench config its
family's bench uses (bench/sana_wm.py MID, bench/family_bench.py HUNYUAN15_MID, bench/speech.py "mid",
bench/ltx2.py MID), plus SANA-WM's caption projection and the Qwen-Omni DiT block at their released widths (the
config defaults). float32, one torch thread, CPU ms per call; the unfused and fused calls alternate, one of each
per round, and medians over the rounds are reported with the load average before and after (the machine is
shared). The max abs difference is against the unfused path (float32 rounding).

    python bench/fused_gelu_families.py [--rounds 9] [--output fused_gelu_families.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for _path in (str(ROOT), str(ROOT / "bench")):  # run as `python bench/fused_gelu_families.py` from anywhere
    if _path not in sys.path:
        sys.path.insert(0, _path)

import torch  # noqa: E402
from torch import Tensor, nn  # noqa: E402

from gemm_epilogue import interleaved_ms, unfused  # noqa: E402
from report import environment, print_table, write_json  # noqa: E402

Case = tuple[nn.Module, Callable[[], Tensor]]  # the module, a call running it on fixed inputs


def _sana_mlp(dim_in: int, hidden: int, dim_out: int, tokens: int) -> Case:
    from vidloom.families.sana_wm.transformer import MLP

    mlp, x = MLP(dim_in, hidden, dim_out), torch.randn(1, tokens, dim_in)
    return mlp, lambda: mlp(x)


def _sana_cases() -> dict[str, Callable[[], Case]]:
    from sana_wm import MID
    from vidloom.families.sana_wm.config import SanaWMConfig

    mid, real = MID.transformer, SanaWMConfig()
    width = mid["hidden_size"]
    cells = 11 * 8 * 12  # bench/sana_wm.py mid: 81 frames (11 latent frames) at 8 x 12 latent cells
    return {
        f"sana-wm-mid caption projection ({mid['caption_channels']} -> {width}, 300 tokens)":
            lambda: _sana_mlp(mid["caption_channels"], width, width, 300),
        f"sana-wm-mid ffn_type=mlp FFN ({width} -> {int(width * mid['mlp_ratio'])}, {cells} tokens)":
            lambda: _sana_mlp(width, int(width * mid["mlp_ratio"]), width, cells),
        f"sana-wm released caption projection ({real.caption_channels} -> {real.hidden_size}, 300 tokens)":
            lambda: _sana_mlp(real.caption_channels, real.hidden_size, real.hidden_size, 300),
    }


def _hunyuan_block(video: int, condition: int) -> Case:
    from family_bench import HUNYUAN15_MID as MID
    from vidloom.families.hunyuan15.layers import DualStreamBlock
    from vidloom.layers.attention import attention

    dim, head_dim = MID["num_attention_heads"] * MID["attention_head_dim"], MID["attention_head_dim"]
    block = DualStreamBlock(dim, head_dim, MID["mlp_ratio"], attention)
    h, temb = torch.randn(1, video + condition, dim), torch.randn(1, dim)
    angles = torch.randn(video, head_dim)
    return block, lambda: block(h, video, temb, None, (angles.cos(), angles.sin()), torch.float32)


def _hunyuan_mlp(tokens: int) -> Case:
    from family_bench import HUNYUAN15_MID as MID
    from vidloom.families.hunyuan15.layers import MLP

    mlp = MLP(MID["num_attention_heads"] * MID["attention_head_dim"], MID["mlp_ratio"], tanh_gelu=True)
    x = torch.randn(1, tokens, mlp.up.in_features)
    return mlp, lambda: mlp(x)


def _qwen_omni_block(dit: dict[str, Any], frames: int) -> Case:
    from vidloom.families.qwen_omni.config import DiTConfig
    from vidloom.families.qwen_omni.dit import DiTBlock

    config = DiTConfig.from_raw(dit)
    block = DiTBlock(config, look_back=1, look_ahead=1)
    x, t_emb = torch.randn(2, frames, config.hidden_size), torch.randn(2, config.hidden_size)  # the CFG pair
    angles = torch.randn(1, frames, config.head_dim)
    blocks = torch.arange(frames) // config.block_size
    diff = blocks[None, :] - blocks[:, None]
    return block, lambda: block(x, t_emb, (angles.cos(), angles.sin()), diff)


def _qwen_omni_cases() -> dict[str, Callable[[], Case]]:
    from speech import SIZES

    mid = SIZES["mid"].dit
    # transformers' Qwen2_5OmniDiTConfig defaults (the released token2wav DiT): 1024 wide, 16 heads x 64, ff x2.
    released = {**mid, "hidden_size": 1024, "num_attention_heads": 16, "head_dim": 64, "ff_mult": 2}
    return {f"qwen-omni mid DiT block ({mid['hidden_size']} wide, 2 x 600 frames)": lambda: _qwen_omni_block(mid, 600),
            "qwen-omni released-width DiT block (1024 wide, 2 x 300 frames)": lambda: _qwen_omni_block(released, 300)}


def _ltx2_caption() -> Case:
    from ltx2 import MID
    from vidloom.models.ltx2.layers import CaptionProjection

    projection = CaptionProjection(MID.text_hidden, MID.transformer["num_attention_heads"]
                                   * MID.transformer["attention_head_dim"])
    x = torch.randn(1, 1024, MID.text_hidden)  # LTX2Pipeline's max_sequence_length
    return projection, lambda: projection(x)


def cases() -> dict[str, Callable[[], Case]]:
    return {**_sana_cases(),
            "hunyuan15-mid dual-stream block (768 video + 128 condition tokens)": lambda: _hunyuan_block(768, 128),
            "hunyuan15-mid block MLP (512 -> 2048, 768 tokens)": lambda: _hunyuan_mlp(768),
            **_qwen_omni_cases(),
            "ltx2-mid video caption projection (1024 tokens)": _ltx2_caption}


def measure(build: Callable[[], Case], rounds: int) -> dict[str, Any]:
    torch.manual_seed(0)
    module, run = build()
    module.eval()
    with torch.inference_mode():
        diff = (run() - unfused(run)()).abs().max().item()
        ms = interleaved_ms({"unfused": unfused(run), "fused": run}, rounds)
    median = {name: round(statistics.median(v), 3) for name, v in ms.items()}
    return {"median_cpu_ms": median, "best_cpu_ms": {name: round(min(v), 3) for name, v in ms.items()},
            "speedup_median": round(median["unfused"] / median["fused"], 3), "max_abs_diff": diff}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--only", default=None, help="run the cases whose name contains this")
    parser.add_argument("--output", default="fused_gelu_families.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    results: dict[str, Any] = {}
    for name, build in cases().items():
        if args.only is None or args.only in name:
            load = [round(v, 2) for v in os.getloadavg()]
            results[name] = {**measure(build, args.rounds), "loadavg_start": load,
                             "loadavg_end": [round(v, 2) for v in os.getloadavg()]}
            print(name, json.dumps(results[name]), flush=True)
    print_table(["case", "unfused ms", "fused ms", "speed-up", "load"],
                [[name, str(r["median_cpu_ms"]["unfused"]), str(r["median_cpu_ms"]["fused"]),
                  f"{r['speedup_median']}x", str(r["loadavg_start"][0])] for name, r in results.items()])
    write_json(args.output, {"environment": environment(), "torch_threads": 1, "rounds": args.rounds,
                             "cases": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
