"""Sequence parallel over a joined [text, image] stream (Flux2, Qwen-Image), [global token, audio] stream (Stable
Audio), [video, condition] stream (HunyuanVideo-1.5) or [history, chunk] stream (Helios), with ranks as threads (no
processes).

The joined stream is sharded as one sequence: a rank may hold text rows, image rows or both; a stream that
does not split is padded at its end, the pad rows are no keys and never reach the head.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Callable

import pytest
import torch

from tests.helpers.thread_comm import run_ranks, thread_group
from vidloom.families.flux2.transformer import Flux2Transformer, Flux2TransformerConfig
from vidloom.families.helios.config import HeliosTransformerConfig
from vidloom.families.helios.transformer import HeliosHistory, HeliosTransformer
from vidloom.families.hunyuan15.transformer import Hunyuan15Transformer, Hunyuan15TransformerConfig
from vidloom.families.qwen_image.transformer import QwenImageTransformer, QwenImageTransformerConfig
from vidloom.families.stable_audio.transformer import StableAudioDiT, StableAudioDiTConfig
from vidloom.runtime.parallel.ulysses import TokenShards, UlyssesAttention, apply_sp

# fp32: the exchanges only move values; ranks see fewer rows per matmul and per-head attention, so only
# summation order inside kernels may change. Observed <= ~2e-7 here; 1e-5 still catches one misplaced row
# (text weights on an image row, a pad row as a key), which moves outputs by order 1.
FP32_TOL = 1e-5
FLUX2 = Flux2TransformerConfig(in_channels=8, out_channels=8, num_double_layers=2, num_single_layers=1, head_dim=8,
                               num_heads=4, text_dim=12, timestep_channels=16, rope_axes=(2, 2, 2, 2))
QWEN = QwenImageTransformerConfig(patch_size=2, in_channels=16, out_channels=4, num_layers=2, head_dim=8,
                                  num_heads=4, text_dim=12, rope_axes=(2, 4, 2))
STABLE_AUDIO = StableAudioDiTConfig(sample_size=32, in_channels=8, num_layers=2, head_dim=8, num_heads=4, num_kv_heads=2,
                                    out_channels=8, cross_attention_dim=16, time_proj_dim=8, global_states_input_dim=12,
                                    cross_attention_input_dim=12)

HUNYUAN15 = Hunyuan15TransformerConfig(in_channels=9, out_channels=4, num_heads=4, head_dim=8, num_layers=2,
                                       num_refiner_layers=1, mlp_ratio=2.0, text_dim=12, glyph_dim=10, image_dim=6,
                                       rope_axes=(2, 2, 4), use_meanflow=True)
# Two heads: Ulysses over 2 ranks, ring attention over 4; the released switches (amplified history keys per head,
# zero-timestep history, text for the chunk's rows only).
HELIOS = HeliosTransformerConfig(num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4,
                                 text_dim=12, freq_dim=16, ffn_dim=32, num_layers=2, rope_dim=(2, 2, 4),
                                 is_amplify_history=True)


def _flux2_inputs(text: int, image: int) -> tuple[Any, ...]:
    g = torch.Generator().manual_seed(1)
    img_ids = torch.stack([torch.zeros(image), torch.arange(image) // 3, torch.arange(image) % 3,
                           torch.zeros(image)], dim=-1).long()
    txt_ids = torch.stack([torch.zeros(text), torch.zeros(text), torch.zeros(text), torch.arange(text)], -1).long()
    return (torch.randn(1, image, 8, generator=g), torch.randn(1, text, 12, generator=g), torch.tensor([0.7]),
            img_ids, txt_ids)


def _qwen_inputs(text: int, grids: tuple[tuple[int, int], ...]) -> tuple[Any, ...]:
    g = torch.Generator().manual_seed(2)
    image = sum(h * w for h, w in grids)
    return torch.randn(1, image, 16, generator=g), torch.randn(1, text, 12, generator=g), torch.tensor([0.4]), grids


def _stable_audio_inputs(steps: int) -> tuple[Any, ...]:
    g = torch.Generator().manual_seed(3)
    return (torch.randn(1, 8, steps, generator=g), torch.tensor([0.3]), torch.randn(1, 5, 12, generator=g),
            torch.randn(1, 1, 12, generator=g))


def _hunyuan15_inputs(text: int) -> tuple[Any, ...]:
    """A 2x2x3 latent grid (12 video rows), `text` valid of 7 text tokens, 3 of 4 glyph tokens and 2 image tokens."""
    g = torch.Generator().manual_seed(4)
    text_mask = (torch.arange(7) < text).long()[None]
    glyph_mask = torch.tensor([[1, 1, 0, 1]])
    return (torch.randn(1, 9, 2, 2, 3, generator=g), torch.tensor([600.0]), torch.randn(1, 7, 12, generator=g),
            text_mask, torch.randn(1, 4, 10, generator=g), glyph_mask, torch.randn(1, 2, 6, generator=g),
            torch.tensor([400.0]))


def _helios_inputs(frames: int) -> tuple[Any, ...]:
    """A chunk of `frames` latent frames on a 2x6 latent grid (3 rows each) behind 9 history rows: short 2 frames (6
    rows), mid 2 (2 rows at 2x), long 4 (1 row at 4x, edge-padded)."""
    g = torch.Generator().manual_seed(5)
    history = HeliosHistory(torch.randn(1, 4, 2, 2, 6, generator=g), torch.tensor([0, 7]),
                            torch.randn(1, 4, 2, 2, 6, generator=g), torch.tensor([5, 6]),
                            torch.randn(1, 4, 4, 2, 6, generator=g), torch.tensor([1, 2, 3, 4]))
    return (torch.randn(1, 4, frames, 2, 6, generator=g), torch.tensor([700.0]), torch.randn(1, 5, 12, generator=g),
            torch.arange(frames) + 8, history)


def _helios() -> HeliosTransformer:
    model = HeliosTransformer(HELIOS)
    for block in model.blocks:  # the checkpoint's per-head amplification (ones until loaded)
        block.self_attn.history_key_scale.data.normal_()
    return model


def _stable_audio(steps: int) -> StableAudioDiT:
    model = StableAudioDiT(STABLE_AUDIO)
    model.time_freqs.data.normal_()  # the checkpoint's random Fourier frequencies (zeros until loaded)
    return model


CASES: dict[str, Callable[[int], tuple[torch.nn.Module, tuple[Any, ...]]]] = {
    # 5 text + 12 image rows: 17 does not split over 2 or 4 (padded); rank 0 of 4 holds text rows only.
    "flux2": lambda text: (Flux2Transformer(FLUX2), _flux2_inputs(text, 12)),
    # a 2x3 target grid and a 2x2 reference grid (an edit): 10 image rows after `text` text rows.
    "qwen_image": lambda text: (QwenImageTransformer(QWEN), _qwen_inputs(text, ((2, 3), (2, 2)))),
    # the same under zero_cond_t (Qwen-Image-Edit-2511): each rank modulates its reference rows at timestep 0.
    "qwen_image_2511": lambda text: (QwenImageTransformer(dataclasses.replace(QWEN, zero_cond_t=True)),
                                     _qwen_inputs(text, ((2, 3), (2, 2)))),
    # the global token then `text + 8` latent steps: 14 rows split over 2, are padded over 4; 15 padded over 2.
    "stable_audio": lambda text: (_stable_audio(text + 8), _stable_audio_inputs(text + 8)),
    # 12 video rows, then 2 image + 3 glyph + `text` text rows: 22 split over 2, are padded over 4; 23 padded over 2.
    "hunyuan15": lambda text: (Hunyuan15Transformer(HUNYUAN15), _hunyuan15_inputs(text)),
    # 9 history rows, then `text - 3` chunk frames of 3 rows: 15 padded over 2 and 4 (rank 0 of 4 holds history only);
    # 18 split over 2.
    "helios": lambda text: (_helios(), _helios_inputs(text - 3)),
}


@pytest.mark.parametrize("family", list(CASES))
@pytest.mark.parametrize(("size", "text"), [(2, 5), (4, 5), (2, 6)])
def test_joint_stream_sp_matches_one_device(family, size, text):
    torch.manual_seed(0)
    model, inputs = CASES[family](text)
    model.eval()
    with torch.inference_mode():
        reference = model(*inputs)
    for out in run_ranks(thread_group(size), lambda comm: _one_rank(model, inputs, comm)):
        assert out.shape == reference.shape
        assert (out - reference).abs().max().item() <= FP32_TOL


def _one_rank(model: torch.nn.Module, inputs: tuple[Any, ...], comm) -> torch.Tensor:
    replica = copy.deepcopy(model)
    apply_sp(replica, comm)
    with torch.inference_mode():
        return replica(*inputs)


def test_shard_joint_pads_the_end_and_counts_each_rank_s_text_rows():
    tokens = torch.arange(7.0).reshape(1, 7, 1)
    table = torch.arange(7.0)[:, None]
    parts = [TokenShards(comm).shard_joint(tokens, (table,), prefix=3) for comm in thread_group(4)]
    assert [p.prefix for p in parts] == [2, 1, 0, 0]  # rows [0, 2), [2, 4), [4, 6), [6, 8): text is rows 0-2
    assert [p.tokens.shape[1] for p in parts] == [2, 2, 2, 2] and all(p.length == 7 for p in parts)
    assert parts[3].tokens[0, :, 0].tolist() == [6.0, 0.0] and parts[3].tables[0][:, 0].tolist() == [6.0, 0.0]
    assert parts[0].key_mask is not None and parts[0].key_mask.tolist() == [True] * 7 + [False]
    even = TokenShards(thread_group(2)[0]).shard_joint(tokens[:, :6], (table[:6],), prefix=3)
    assert even.key_mask is None and even.prefix == 3


def test_ulysses_refuses_any_mask_but_a_padded_sequence_s():
    (comm,) = thread_group(1)
    wrapped = UlyssesAttention(lambda q, k, v, mask=None: q, comm)
    q = torch.zeros(1, 4, 2, 8)
    with pytest.raises(ValueError, match=r"only a padded sequence's key mask \(\[4\] bool on the CPU\)"):
        wrapped(q, q, q, torch.ones(1, 1, 4, 4, dtype=torch.bool))


def test_helios_ranks_hold_their_rows_of_the_history_and_chunk_stream():
    """Each of 4 ranks runs the blocks on its 4 rows of the padded 15 (9 history, then 6 chunk rows)."""
    model, inputs = CASES["helios"](5)
    seen: list[tuple[int, int, int]] = []

    def one_rank(comm) -> torch.Tensor:
        replica = copy.deepcopy(model)
        apply_sp(replica, comm)
        replica.blocks[0].register_forward_pre_hook(
            lambda _, args: seen.append((comm.rank, args[0].shape[1], args[1].num_history)))
        with torch.inference_mode():
            return replica(*inputs)

    run_ranks(thread_group(4), one_rank)
    assert sorted(seen) == [(0, 4, 4), (1, 4, 4), (2, 4, 1), (3, 4, 0)]
