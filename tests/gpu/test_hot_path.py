"""The fused elementwise hot path, text-encoder offload and on-device uint8 frames, on a real device."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from vidloom.media.frames import to_uint8
from vidloom.models.wan.ops import apply_rope, apply_rope_reference, gated_residual, modulate, rope_freqs


def test_fused_ops_on_cuda_match_the_formulas_within_one_ulp():
    gen = torch.Generator("cuda").manual_seed(0)
    x = torch.randn(1, 4096, 1536, device="cuda", generator=gen).bfloat16()
    update = torch.randn(1, 4096, 1536, device="cuda", generator=gen).bfloat16()
    shift, scale, gate = (torch.randn(1, 1, 1536, device="cuda", generator=gen) for _ in range(3))
    normed = F.layer_norm(x.float(), (1536,), None, None, 1e-6)
    cases = [
        (modulate(x, shift, scale, 1e-6), (normed * (1 + scale) + shift).bfloat16()),
        (gated_residual(x, update, gate), (x.float() + update * gate).bfloat16()),
    ]
    eps = torch.finfo(torch.bfloat16).eps
    for fused, formula in cases:
        rel = ((fused.float() - formula.float()).abs() / formula.float().abs().clamp(min=1.0)).max().item()
        assert rel <= eps, rel


def test_complex_rope_on_cuda_matches_the_real_form():
    grid = (21, 6, 8)
    x = torch.randn(1, 21 * 6 * 8, 12, 128, device="cuda").bfloat16()
    freqs = rope_freqs(grid, 128, torch.device("cuda"))
    got = apply_rope(x, freqs)
    ref = apply_rope_reference(x, freqs[..., 0], freqs[..., 1])
    assert (got.float() - ref.float()).abs().max().item() <= 2 * torch.finfo(torch.bfloat16).eps * x.abs().max().item()


def test_dit_on_cuda_matches_diffusers_in_fp32():
    diffusers = pytest.importorskip("diffusers")
    from vidloom.models.wan.transformer import WanTransformer
    from vidloom.models.wan.transformer_config import WAN_TRANSFORMER_NAME_MAP, WanTransformerConfig

    torch.manual_seed(0)
    kwargs = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4,
                  text_dim=24, freq_dim=16, ffn_dim=32, num_layers=2, cross_attn_norm=True)
    ref = diffusers.WanTransformer3DModel(**kwargs).eval().cuda()
    ours = WanTransformer(WanTransformerConfig.from_diffusers(ref.config)).eval().cuda()
    ours.load_state_dict({WAN_TRANSFORMER_NAME_MAP.to_module(k): v for k, v in ref.state_dict().items()})
    latents, text = torch.randn(1, 4, 3, 8, 8, device="cuda"), torch.randn(1, 7, 24, device="cuda")
    timestep = torch.tensor([437.0], device="cuda")
    with torch.inference_mode():
        expected = ref(latents, timestep, text, return_dict=False)[0]
        got = ours(latents, timestep, text)
    # fp32 on CUDA: fused multiply-adds and kernel choices move results by a few ulp.
    assert (got - expected).abs().max().item() <= 1e-4


def test_frames_convert_to_uint8_on_the_device_with_the_host_rounding():
    frames = torch.rand(5, 32, 48, 3, device="cuda") * 1.1 - 0.05
    assert np.array_equal(to_uint8(frames).cpu().numpy(), to_uint8(frames.cpu().numpy()))


def test_offloaded_text_encoder_uses_pinned_memory_and_frees_the_gpu_copy(demo_cache):
    from vidloom.families.wan.demo import ensure_demo_checkpoint
    from vidloom.models.wan.text import WanTextEncoder

    folder = ensure_demo_checkpoint(demo_cache)
    load = lambda **o: WanTextEncoder.load(folder / "tokenizer", folder / "text_encoder",  # noqa: E731
                                           torch.device("cuda"), torch.float32, **o)
    resident = load()
    reference = resident.encode(["a cat"])
    del resident
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    offloaded = load(offload=True)
    assert all(p.device.type == "cpu" and p.is_pinned() for p in offloaded.model.parameters())
    out = offloaded.encode(["a cat"])
    assert out.device.type == "cuda" and torch.allclose(out, reference, rtol=0, atol=1e-5)
    del out
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() <= before, "the GPU copy of the weights was kept"
    assert all(p.device.type == "cpu" for p in offloaded.model.parameters())
