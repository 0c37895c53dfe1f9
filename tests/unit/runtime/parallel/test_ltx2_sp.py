"""LTX-2 under sequence parallel with ranks as threads: the video and the audio stream each sharded (padded where
they do not split), self-attention and the audio<->video attentions across the shards, equal to one device.

fp32 on CPU: the exchanges copy values; only summation order inside kernels that see other shapes changes
(measured <= 5e-7 on these velocities, whose peak is ~2); 1e-5 still catches one misplaced row, head or pad key.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from tests.helpers.thread_comm import run_ranks, thread_group
from vidloom.models.ltx2.rope import audio_positions, video_positions
from vidloom.models.ltx2.transformer import LTX2Positions, LTX2Transformer, LTX2TransformerConfig
from vidloom.runtime.parallel.ring import RingAttention
from vidloom.runtime.parallel.ulysses import ShardedCrossAttention, UlyssesAttention, apply_sp

FP32_TOL = 1e-5
# Two heads per stream (Ulysses over 2 ranks, ring over 4), split rotary tables, per-sample modulation.
SPLIT = LTX2TransformerConfig(
    in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8, cross_attention_dim=16,
    audio_in_channels=4, audio_out_channels=4, audio_num_attention_heads=2, audio_attention_head_dim=4,
    audio_cross_attention_dim=8, num_layers=2, caption_channels=8, rope_type="split", rope_double_precision=False)
# Three heads (ring attention and gathered cross keys at any degree), interleaved tables, LTX-2.3's gated,
# query-modulated attention with prompt AdaLN and the perturbed-attention (STG) blocks.
INTERLEAVED = dataclasses.replace(
    SPLIT, num_attention_heads=3, audio_num_attention_heads=3, cross_attention_dim=24, audio_cross_attention_dim=12,
    rope_type="interleaved",
    gated_attn=True, audio_gated_attn=True, cross_attn_mod=True, audio_cross_attn_mod=True, perturbed_attn=True)


def _transformer(config: LTX2TransformerConfig) -> LTX2Transformer:
    torch.manual_seed(0)
    dit = LTX2Transformer(config).eval()
    with torch.no_grad():
        for name, p in dit.named_parameters():
            if "table" in name:  # zeros at init: the modulation would hide a misplaced row
                p.normal_(0, 0.5)
    return dit


def _inputs(c: LTX2TransformerConfig, grid: tuple[int, int, int], audio: int, per_token: bool) -> tuple:
    cpu, g = torch.device("cpu"), torch.Generator().manual_seed(1)
    frames, height, width = grid
    tokens = frames * height * width
    positions = LTX2Positions(
        video_positions(1, frames, height, width, patch_t=1, patch=1, scale=c.vae_scale_factors,
                        causal_offset=c.causal_offset, fps=24.0, device=cpu),
        audio_positions(1, audio, patch_t=1, scale=c.audio_scale_factor, causal_offset=c.causal_offset,
                        hop_length=c.audio_hop_length, sample_rate=c.audio_sampling_rate, device=cpu))
    timestep = torch.tensor([700.0])
    if per_token:  # image-to-video: the first frame's tokens at timestep 0
        timestep = timestep[:, None] * (torch.arange(tokens) >= height * width)[None].float()
    mask = torch.ones(1, 6, dtype=torch.int64)
    mask[:, :2] = 0
    return (torch.randn(1, tokens, 4, generator=g), torch.randn(1, audio, 4, generator=g),
            torch.randn(1, 6, 8, generator=g), torch.randn(1, 6, 8, generator=g), mask, timestep,
            torch.tensor([700.0]), torch.tensor([0.7]), positions)


CASES = {
    # 12 video rows split over 2 and 3; 5 audio rows are padded.
    "split": (SPLIT, (2, 2, 3), 5, False, {}),
    # 2x3x3 = 18 video rows, padded over 4; 7 audio rows padded over 2 and 4; per-token timesteps; STG block 1.
    "interleaved-i2v-stg": (INTERLEAVED, (2, 3, 3), 7, True, {"skip_self_attention": frozenset({1})}),
    "isolated": (SPLIT, (2, 2, 3), 5, False, {"isolate_modalities": True}),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("size", [2, 3, 4])
def test_both_streams_sharded_match_one_device(case, size):
    config, grid, audio, per_token, kwargs = CASES[case]
    dit = _transformer(config)
    inputs = _inputs(config, grid, audio, per_token)
    with torch.inference_mode():
        want = dit(*inputs, use_cross_timestep=True, **kwargs)

    def one_rank(comm):
        replica = copy.deepcopy(dit)
        apply_sp(replica, comm)
        with torch.inference_mode():
            return replica(*inputs, use_cross_timestep=True, **kwargs)

    for got in run_ranks(thread_group(size), one_rank):
        for g, w in zip(got, want):
            assert g.shape == w.shape
            assert (g - w).abs().max().item() <= FP32_TOL


def test_apply_sp_wraps_self_and_cross_attention_but_not_the_text():
    dit = _transformer(INTERLEAVED)
    apply_sp(dit, thread_group(2)[0])
    block = dit.blocks[0]
    assert isinstance(block.video_self.attention_fn, RingAttention)  # 3 heads over 2 ranks
    assert isinstance(block.a2v.attention_fn, ShardedCrossAttention)
    assert isinstance(block.v2a.attention_fn, ShardedCrossAttention)
    assert not isinstance(block.video_text.attention_fn, (RingAttention, UlyssesAttention, ShardedCrossAttention))
    even = _transformer(SPLIT)
    apply_sp(even, thread_group(2)[0])
    assert isinstance(even.blocks[0].audio_self.attention_fn, UlyssesAttention)


def test_cross_attention_takes_the_smaller_exchange():
    """Video queries (long) to audio keys (short): the audio keys are gathered; the reverse goes to head shards
    where the degree divides the heads."""
    wrapped = ShardedCrossAttention(lambda q, k, v, mask=None: q, thread_group(2)[0], num_heads=4)
    assert not wrapped.ulysses(queries=100, keys=10) and wrapped.ulysses(queries=10, keys=100)
    assert not ShardedCrossAttention(wrapped.inner, wrapped.comm, num_heads=3).ulysses(queries=10, keys=100)
