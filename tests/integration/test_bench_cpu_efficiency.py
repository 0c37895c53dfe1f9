"""bench/cpu_efficiency.py counts the matmul FLOPs of one DiT forward: its analytic counts equal torch's
FlopCounterMode over vidloom's own Wan and Flux2 transformers (tiny configs, every matmul counted)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from cpu_efficiency import _mm, flux2_flops, wan_flops  # noqa: E402

from vidloom.families.flux2.transformer import Flux2Transformer, Flux2TransformerConfig  # noqa: E402
from vidloom.models.wan.transformer import WanTransformer  # noqa: E402
from vidloom.models.wan.transformer_config import WanTransformerConfig  # noqa: E402


def counted(forward) -> int:
    # SDPA's math kernel runs QK^T and PV as bmm, which FlopCounterMode counts (it has no rule for the CPU
    # flash kernel the default dispatch picks).
    with torch.inference_mode(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        forward()
    return counter.get_total_flops()


def test_wan_count_equals_flop_counter_mode():
    cfg = WanTransformerConfig(num_attention_heads=2, attention_head_dim=12, text_dim=20, freq_dim=16, ffn_dim=40,
                               num_layers=2)
    model = WanTransformer(cfg).eval()
    grid, text_tokens = (2, 3, 4), 5
    latents = torch.randn(1, cfg.in_channels, 2, 6, 8)
    total = counted(lambda: model(latents, torch.tensor([500.0]), torch.randn(1, text_tokens, cfg.text_dim)))
    assert sum(wan_flops(cfg, 1, grid, text_tokens).values()) == total
    # By hand: one block's self-attention QK^T on 24 tokens of width 24 is 2 * 24 * 24 * 24 FLOPs.
    assert _mm(24, 24, 24) == 27648


def test_flux2_count_equals_flop_counter_mode():
    cfg = Flux2TransformerConfig(in_channels=8, out_channels=8, num_double_layers=1, num_single_layers=2, head_dim=16,
                                 num_heads=2, text_dim=24, timestep_channels=16, rope_axes=(4, 4, 4, 4))
    model = Flux2Transformer(cfg).eval()
    side, text_tokens = 3, 4
    rows, cols = torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")
    zeros = torch.zeros(side * side, dtype=torch.long)
    img_ids = torch.stack([zeros, rows.flatten(), cols.flatten(), zeros], dim=-1)
    txt_ids = torch.stack([torch.zeros(text_tokens, dtype=torch.long)] * 3 + [torch.arange(text_tokens)], dim=-1)
    img, txt = torch.randn(1, side * side, 8), torch.randn(1, text_tokens, 24)
    total = counted(lambda: model(img, txt, torch.tensor([0.75]), img_ids, txt_ids))
    assert sum(flux2_flops(cfg, 1, side * side, text_tokens).values()) == total
