"""SANA-WM refiner DiT parity: our LTX-2 transformer run through families/sana_wm/refiner.py vs diffusers'
SanaWMLTX2RefinerTransformer3DModel, forward by forward over a chunk-causal window (sink capture, denoise
steps that attend to the sink and history, history capture, a trimmed history with a slid sink rotary)."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.sana_wm_checkpoints import CONFIGS, TinySanaWM, build_refiner
from vidloom.core.errors import CheckpointError
from vidloom.families.sana_wm.checkpoint import load_refiner_transformer
from vidloom.families.sana_wm.refiner import RefinerWindow, WindowMode, frame_rope, refiner_velocity

# Same op order as the reference in float32; observed differences are ~1e-6 on outputs of ~1-10.
TOLERANCE = 1e-4
FPS, H, W, SINK, BLOCK, KV_MAX = 16.0, 2, 3, 1, 2, 3
REFINER_SPECS = [s for s in CONFIGS if s.refiner is not None]


def _pack(latents: torch.Tensor) -> torch.Tensor:
    return latents.flatten(2).transpose(1, 2)  # patch size 1: [B, C, F, H, W] -> [B, F*H*W, C]


def _reference_step(ref, tokens, text, mask, sigma, frames, cache, mode):
    rope = ref.build_rotary_emb_for_absolute_positions(batch_size=tokens.shape[0], frame_positions=frames,
                                                       height=H, width=W, device=tokens.device, fps=FPS)
    timestep = torch.full(tokens.shape[:2], sigma * 1000.0)
    return ref(hidden_states=tokens, encoder_hidden_states=text, timestep=timestep, video_rotary_emb=rope,
               encoder_attention_mask=mask, kv_cache=cache, kv_cache_mode=mode, return_dict=False)[0]


@pytest.mark.parametrize("spec", REFINER_SPECS, ids=lambda s: s.name)
def test_windowed_forwards_match_diffusers(spec: TinySanaWM, tmp_path):
    from diffusers.models.transformers.transformer_sana_wm_refiner import SanaWMRefinerKVCache

    ref = build_refiner(spec).transformer
    ref.save_pretrained(str(tmp_path))
    ours = load_refiner_transformer(tmp_path)
    g = torch.Generator().manual_seed(0)
    z = torch.randn(1, 8, 6, H, W, generator=g)
    text = torch.randn(1, 5, ref.config.caption_channels, generator=g)
    mask = torch.tensor([[0, 1, 1, 1, 1]])  # left padding, as the Gemma-3 prompt path pads
    layers = len(ref.transformer_blocks)
    cache = SanaWMRefinerKVCache(layers)
    window = RefinerWindow(layers, 1, ours.config.dim, SINK * H * W, (KV_MAX - SINK) * H * W, H * W,
                           torch.device("cpu"), torch.float32)
    compared = 0
    with torch.no_grad():
        _reference_step(ref, _pack(z[:, :, :SINK]), text, mask, 0.0, [0], cache, "capture_pre_rope")
        for i in range(layers):
            cache.get(i).store_sink(*cache.get(i).get_captured_pre_rope())
        refiner_velocity(ours, _pack(z[:, :, :SINK]), text, mask, torch.zeros(1), frame_rope(ours, 1, 0, SINK, H, W,
                         FPS, torch.device("cpu")), window, WindowMode.CAPTURE_SINK)
        window.store_sink()
        history = 0
        for start in range(SINK, 6, BLOCK):
            frames = list(range(start, min(start + BLOCK, 6)))
            offset = start - history - SINK
            cache.sink_pe = ref.build_rotary_emb_for_absolute_positions(
                batch_size=1, frame_positions=list(range(offset, offset + SINK)), height=H, width=W,
                device=torch.device("cpu"), fps=FPS)
            window.sink_rope = frame_rope(ours, 1, offset, SINK, H, W, FPS, torch.device("cpu"))
            rope = frame_rope(ours, 1, start, len(frames), H, W, FPS, torch.device("cpu"))
            tokens = _pack(z[:, :, frames[0]:frames[-1] + 1])
            for sigma in (0.9, 0.4):
                expected = _reference_step(ref, tokens, text, mask, sigma, frames, cache, "inject")
                got = refiner_velocity(ours, tokens, text, mask, torch.tensor([sigma * 1000.0]), rope, window,
                                       WindowMode.ATTEND)
                assert (got - expected).abs().max().item() < TOLERANCE
                compared += 1
            _reference_step(ref, tokens, text, mask, 0.0, frames, cache, "inject_and_capture_post_rope")
            refiner_velocity(ours, tokens, text, mask, torch.zeros(1), rope, window, WindowMode.CAPTURE_HISTORY)
            for i in range(layers):
                new_k, new_v = cache.get(i).get_captured_post_rope()
                old = cache.get(i).get_history()
                k, v = (new_k, new_v) if old is None else (torch.cat([old[0], new_k], 1), torch.cat([old[1], new_v], 1))
                keep = (KV_MAX - SINK) * H * W
                cache.get(i).store_history(k[:, -keep:], v[:, -keep:])
            history = min(history + len(frames), KV_MAX - SINK)
            window.append_history()
            assert window.history_frames == history
            for i in range(layers):
                torch.testing.assert_close(window.layer_kv(i)[2], cache.get(i).history_k, atol=TOLERANCE, rtol=0)
    assert compared == 6


def test_refiner_config_refused_by_name(tmp_path):
    spec = REFINER_SPECS[0]
    from diffusers import SanaWMLTX2RefinerTransformer3DModel

    SanaWMLTX2RefinerTransformer3DModel(caption_channels=16, cross_attn_mod=True,
                                        **spec.refiner).save_pretrained(str(tmp_path))
    with pytest.raises(CheckpointError, match="cross_attn_mod"):
        load_refiner_transformer(tmp_path)
