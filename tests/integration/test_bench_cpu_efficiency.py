"""bench/cpu_efficiency.py counts the matmul FLOPs of one DiT forward: its analytic counts equal torch's
FlopCounterMode over vidloom's own Wan and Flux2 transformers (tiny configs, every matmul counted), over Wan's step
given `prepare_prompt`'s keys/values (what vidloom's loop runs), and over diffusers' reference transformers."""

from __future__ import annotations

import sys
from pathlib import Path

import diffusers
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
    # flash kernel the default dispatch picks, nor for oneDNN's fused linear + GELU, layers.fused_linear, which
    # runs the same matmul: oneDNN off here keeps the stock addmm).
    with (torch.inference_mode(), sdpa_kernel(SDPBackend.MATH), torch.backends.mkldnn.flags(enabled=False),
          FlopCounterMode(display=False) as counter):
        forward()
    return counter.get_total_flops()


def test_wan_count_equals_flop_counter_mode():
    cfg = WanTransformerConfig(num_attention_heads=2, attention_head_dim=12, text_dim=20, freq_dim=16, ffn_dim=40,
                               num_layers=2)
    model = WanTransformer(cfg).eval()
    grid, text_tokens = (2, 3, 4), 5
    latents = torch.randn(1, cfg.in_channels, 2, 6, 8)
    text = torch.randn(1, text_tokens, cfg.text_dim)
    total = counted(lambda: model(latents, torch.tensor([500.0]), text))
    assert sum(wan_flops(cfg, 1, grid, text_tokens).values()) == total
    with torch.inference_mode():
        prompt = model.prepare_prompt(text)
    prepared = counted(lambda: model(latents, torch.tensor([500.0]), prompt))
    assert sum(wan_flops(cfg, 1, grid, text_tokens, prompt_prepared=True).values()) == prepared < total
    reference = diffusers.WanTransformer3DModel(
        patch_size=cfg.patch_size, num_attention_heads=2, attention_head_dim=12, in_channels=cfg.in_channels,
        out_channels=cfg.out_channels, text_dim=20, freq_dim=16, ffn_dim=40, num_layers=2).eval()
    assert counted(lambda: reference(latents, torch.tensor([500.0]), text, return_dict=False)) == total
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
    reference = diffusers.Flux2Transformer2DModel(
        patch_size=1, in_channels=8, out_channels=8, num_layers=1, num_single_layers=2, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=24, timestep_guidance_channels=16, axes_dims_rope=(4, 4, 4, 4),
        guidance_embeds=False).eval()
    assert counted(lambda: reference(hidden_states=img, encoder_hidden_states=txt, timestep=torch.tensor([0.75]),
                                     img_ids=img_ids, txt_ids=txt_ids, return_dict=False)) == total
