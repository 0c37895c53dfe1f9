"""SANA-WM's stage-2 refiner under sequence parallel (refiner_parallel.py), ranks as threads: a whole windowed rollout
(sink capture, denoise steps over sink + history, history captures, a trimmed history with a slid sink rotary) on
K ranks gives one device's velocities, with each rank's window holding heads/K of every token.

Both rotary layouts ("split": per-head tables; "interleaved": channel pairs) and the gated attention; 3 x 3 patches a
frame, so a chunk of one frame (9 tokens) pads to split and a chunk of two (18) splits over 2 ranks but pads over 4.
"""

from __future__ import annotations

import copy

import pytest
import torch

from tests.helpers.thread_comm import run_ranks, thread_group
from vidloom.families.sana_wm.refiner import RefinerWindow, WindowMode, frame_rope, refiner_velocity
from vidloom.families.sana_wm.refiner_parallel import WHOLE_CHUNK, ChunkLayout, ChunkShards
from vidloom.models.ltx2.transformer import LTX2Transformer, LTX2TransformerConfig

# float64: the exchanges copy values and only the blocking of kernels over fewer rows differs, but the rotary rotates
# in float32 (rope.apply_rope), where a last-bit difference can round a rotated value one float32 step apart: 1e-8 of
# the peak (observed ~4e-10) still catches any misplaced row or head (~1e-1). float32: 1e-5 of the peak (~1-10).
REL_TOL_64, REL_TOL_32 = 1e-8, 1e-5
FPS, H, W, FRAMES, SINK, BLOCK, KV_MAX = 16.0, 3, 3, 6, 1, 2, 3
BASE = dict(in_channels=8, out_channels=8, num_attention_heads=4, audio_in_channels=8,
            audio_num_attention_heads=2, audio_attention_head_dim=4, audio_cross_attention_dim=8, num_layers=2,
            caption_channels=16, vae_scale_factors=(8, 32, 32), pos_embed_max_pos=20, rope_double_precision=False)
CONFIGS = {
    "split": dict(BASE, attention_head_dim=8, cross_attention_dim=32, rope_type="split"),
    "interleaved-gated": dict(BASE, attention_head_dim=6, cross_attention_dim=24, rope_type="interleaved",
                              gated_attn=True),
}


def _model(config: dict) -> LTX2Transformer:
    torch.manual_seed(0)
    model = LTX2Transformer(LTX2TransformerConfig.from_diffusers(config)).eval()
    with torch.no_grad():  # zero-initialised tables and gates get values, so every path moves the output
        for p in model.parameters():
            p.copy_(0.2 * torch.randn(p.shape))
    return model


def _rollout(dit: LTX2Transformer, shards: ChunkLayout, dtype: torch.dtype) -> tuple[list[torch.Tensor], int]:
    """Every forward's velocity over a 6-frame rollout, and the window's bytes."""
    g = torch.Generator().manual_seed(1)
    z = torch.randn(1, 8, FRAMES, H, W, generator=g, dtype=dtype)
    text, mask = torch.randn(1, 5, 16, generator=g, dtype=dtype), torch.tensor([[0, 1, 1, 1, 1]])
    pack = lambda t: t.flatten(2).transpose(1, 2)  # noqa: E731 (patch size 1)
    per_frame, c = H * W, dit.config
    window = RefinerWindow(c.num_layers, 1, c.dim // shards.size, SINK * per_frame, (KV_MAX - SINK) * per_frame,
                           per_frame, torch.device("cpu"), dtype)
    rope = lambda first, n: frame_rope(dit, 1, first, n, H, W, FPS, torch.device("cpu"))  # noqa: E731
    out = [refiner_velocity(dit, pack(z[:, :, :SINK]), text, mask, torch.zeros(1), rope(0, SINK), window,
                            WindowMode.CAPTURE_SINK, shards)]
    window.store_sink()
    for start in range(SINK, FRAMES, BLOCK):
        end = min(start + BLOCK, FRAMES)
        window.sink_rope = rope(start - window.history_frames - SINK, SINK)
        tokens, chunk_rope = pack(z[:, :, start:end]), rope(start, end - start)
        for sigma in (0.9, 0.4):
            out.append(refiner_velocity(dit, tokens, text, mask, torch.tensor([sigma * 1000.0]), chunk_rope, window,
                                        WindowMode.ATTEND, shards))
        out.append(refiner_velocity(dit, tokens, text, mask, torch.zeros(1), chunk_rope, window,
                                    WindowMode.CAPTURE_HISTORY, shards))
        window.append_history()
    return out, window.nbytes


@pytest.mark.parametrize("size", [2, 4])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_a_sharded_rollout_matches_one_device(name, size):
    model = _model(CONFIGS[name])
    model64 = copy.deepcopy(model).double()
    with torch.inference_mode():
        reference, whole_bytes = _rollout(model, WHOLE_CHUNK, torch.float32)
        reference64, _ = _rollout(model64, WHOLE_CHUNK, torch.float64)
    peak = max(v.abs().max().item() for v in reference64)
    assert peak > 0.1 and len(reference) == 10

    def split(net: LTX2Transformer, dtype: torch.dtype):
        def one_rank(comm) -> tuple[list[torch.Tensor], int]:
            with torch.inference_mode():
                return _rollout(net, ChunkShards(comm), dtype)
        return run_ranks(thread_group(size), one_rank)

    for outs, nbytes in split(model64, torch.float64):
        assert nbytes * size == 2 * whole_bytes  # float64 slab: twice float32's bytes, over `size` ranks
        for got, want in zip(outs, reference64):
            assert got.shape == want.shape
            assert (got - want).abs().max().item() <= REL_TOL_64 * peak
    for outs, nbytes in split(model, torch.float32):
        assert nbytes * size == whole_bytes
        for got, want in zip(outs, reference):
            assert (got - want).abs().max().item() <= REL_TOL_32 * peak


def test_the_refiner_shards_over_stage_1s_group_only_where_it_splits_its_heads():
    """The program and the memory estimate read one decision: stage 1's FrameRows group, if it divides the heads;
    a loop over K ranks sizes its window at heads/K of every token."""
    from types import SimpleNamespace

    from vidloom.families.sana_wm.parallel import FrameRows
    from vidloom.families.sana_wm.refine_loop import SanaWMRefineLoop
    from vidloom.families.sana_wm.refiner_parallel import refiner_layout, whole_reason
    from vidloom.layers.sequence import WHOLE_SEQUENCE

    comm = thread_group(2)[0]
    refiner = _model(CONFIGS["split"])  # 4 heads
    for sequence, heads, sharded in ((FrameRows(comm), 4, True), (FrameRows(comm), 3, False),
                                     (WHOLE_SEQUENCE, 4, False)):
        config = SimpleNamespace(num_attention_heads=heads)
        instance = {"transformer": SimpleNamespace(sequence=sequence), "refiner": SimpleNamespace(config=config)}
        layout = refiner_layout(instance)  # type: ignore[arg-type]
        assert isinstance(layout, ChunkShards) == sharded
        reason = whole_reason(instance)  # type: ignore[arg-type]
        assert (reason is not None) == (sequence is not WHOLE_SEQUENCE and not sharded)
        if reason is not None:
            assert "3 attention heads do not split over sp=2" in reason
    whole = SanaWMRefineLoop(refiner, torch.float32).window_bytes(1, 6, H, W)
    split = SanaWMRefineLoop(refiner, torch.float32, shards=ChunkShards(comm)).window_bytes(1, 6, H, W)
    assert split * 2 == whole > 0
