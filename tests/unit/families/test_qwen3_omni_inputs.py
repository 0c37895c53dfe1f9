"""Qwen3-Omni's audio token count (what the prompt widens an audio placeholder to) equals transformers'."""

from __future__ import annotations

import torch

from vidloom.families.qwen3_omni.encoders import audio_output_length


def test_audio_tokens_per_clip_length_equal_transformers():
    from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import _get_feat_extract_output_lengths

    frames = torch.arange(4, 3001)
    for window in (50, 25):
        expected = _get_feat_extract_output_lengths(frames, window).tolist()
        assert [audio_output_length(int(n), window) for n in frames] == expected


def test_the_audio_towers_convolution_front_is_in_the_media_estimate():
    """Qwen3-Omni's audio tower convolves every 100-frame chunk into downsample_hidden_size channels first: the
    estimate holds that output and its GELU ([chunks, channels, mel/2, 50] each); Qwen2.5-Omni's has no such front."""
    from types import SimpleNamespace

    from vidloom.models.omni_media import MediaPiece, PromptMedia
    from vidloom.models.omni_towers import towers_bytes

    def estimate(channels: int) -> int:
        config = SimpleNamespace(d_model=16, encoder_ffn_dim=32, encoder_attention_heads=2, n_window=50,
                                 downsample_hidden_size=channels)
        towers = SimpleNamespace(audio=SimpleNamespace(config=config))
        piece = MediaPiece("audio", torch.zeros(128, 250), None, torch.arange(33))
        media = PromptMedia((piece,), torch.zeros(3, 40, dtype=torch.long), 0)
        return towers_bytes(towers, (SimpleNamespace(n_fft=400),), media, 32, 2, on_cpu=False)

    assert estimate(480) - estimate(0) == 2 * 3 * 480 * 64 * 50 * 2  # 250 frames: three chunks


# Token ids of a small vocabulary for the prompts below.
_IDS = {"<|audio_pad|>": 3, "<|audio_start|>": 4, "<|audio_end|>": 5, "<|vision_start|>": 6, "<|vision_end|>": 7,
        "<|image_pad|>": 8, "<|video_pad|>": 9}


def _reference_positions(ids, grids, second_per_grid: float, audio_frames, per_second: float, sound: bool):
    """transformers' Qwen3-Omni get_rope_index on `ids` (one video, maybe with its sound track)."""
    import functools
    import types

    from transformers import Qwen3OmniMoeThinkerConfig
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
        Qwen3OmniMoePreTrainedModelForConditionalGeneration as M)

    config = Qwen3OmniMoeThinkerConfig(image_token_id=8, audio_token_id=3, video_token_id=9, vision_start_token_id=6,
                                       audio_start_token_id=4, position_id_per_seconds=per_second)
    fake = types.SimpleNamespace(config=config, spatial_merge_size=2)
    fake.get_llm_pos_ids_for_vision = functools.partial(M.get_llm_pos_ids_for_vision, fake)
    return M.get_rope_index(fake, ids[None], None, grids, torch.ones_like(ids)[None], sound, audio_frames,
                            torch.tensor([second_per_grid]))


def _video_prompt(grid: list[int], audio_tokens: int, second_per_grid: float, per_second: float) -> list[int]:
    """text, a video (with its sound track when audio_tokens), text: widened by the reference processor's rule."""
    from types import SimpleNamespace

    from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import Qwen3OmniMoeProcessor

    if audio_tokens:
        processor = SimpleNamespace(audio_bos_token="<|audio_start|>", audio_eos_token="<|audio_end|>",
                                    video_token="<|video_pad|>", audio_token="<|audio_pad|>",
                                    video_processor=SimpleNamespace(merge_size=2))
        text = Qwen3OmniMoeProcessor.replace_video_with_audio_token(
            processor, {"video_grid_thw": torch.tensor([grid]), "video_second_per_grid": [second_per_grid]}, 0,
            {"num_audio_tokens": [audio_tokens]}, 0, position_id_per_seconds=per_second)
    else:
        text = "<|video_pad|>" * (grid[0] * grid[1] * grid[2] // 4)
    tokens = [t + ">" for t in text.split(">") if t]
    return [1, 20, 6, *[_IDS[t] for t in tokens], 7, 21, 22]


def test_video_positions_equal_get_rope_index():
    """A video alone, and with its sound track: the sound's tail last (a long track), the frames' tail last (a
    short one), and a grid step of a fractional number of positions (float positions, as the reference's)."""
    from vidloom.models.omni_media import VIDEO, MediaPiece, multimodal_positions
    from vidloom.models.omni_video import interleaved
    from vidloom.families.qwen3_omni.encoders import audio_output_length

    cases = [([3, 4, 6], 0, 1.0, 13), ([2, 4, 4], 250, 1.0, 13), ([4, 2, 4], 30, 1.0, 13), ([3, 4, 2], 0, 0.8, 13),
             ([3, 2, 2], 120, 0.8, 13)]
    for grid, frames, spg, per_second in cases:
        tokens = audio_output_length(frames) if frames else 0
        ids = torch.tensor(_video_prompt(grid, tokens, spg, per_second))
        video_at = torch.nonzero(ids == 9).flatten()
        audio_at = torch.nonzero(ids == 3).flatten() if frames else None
        grid_t = torch.tensor([grid])
        pieces = [MediaPiece(VIDEO, torch.zeros(1), grid_t, video_at, spg, per_second, audio_at)]
        if frames:  # our widening places the tokens as the reference processor does
            order = interleaved(torch.arange(grid[0]).repeat_interleave(grid[1] * grid[2] // 4) * spg * per_second,
                                tokens)
            assert order == [int(t) == 9 for t in ids[video_at[0]:max(video_at[-1], audio_at[-1]) + 1]]
        positions, delta = multimodal_positions(len(ids), pieces, merge_size=2)
        expected, expected_delta = _reference_positions(ids, grid_t, spg, torch.tensor([frames]) if frames else None,
                                                        per_second, bool(frames))
        torch.testing.assert_close(positions.float(), expected[:, 0], rtol=0, atol=0)
        assert float(delta) == float(expected_delta), (grid, frames, spg)
        assert positions.dtype == (torch.long if spg * per_second == int(spg * per_second) else torch.float32)


def test_a_videos_tower_attention_is_estimated_per_temporal_step():
    """The vision tower attends within each temporal step of a video (transformers' cu_seqlens per frame group):
    its scores are [heads, rows, rows / grid_t], not the square of all its patches."""
    from types import SimpleNamespace

    from vidloom.models.omni_media import MediaPiece, PromptMedia
    from vidloom.models.omni_towers import SCORE_COPIES, towers_bytes

    config = SimpleNamespace(hidden_size=16, intermediate_size=32, num_heads=2)
    towers = SimpleNamespace(vision=SimpleNamespace(config=config))

    def estimate(grid: list[int]) -> int:
        piece = MediaPiece("video", torch.zeros(64, 24), torch.tensor([grid]), torch.arange(16))
        media = PromptMedia((piece,), torch.zeros(3, 20, dtype=torch.long), 0)
        return towers_bytes(towers, None, media, 32, 2, on_cpu=False)

    assert estimate([1, 8, 8]) - estimate([4, 4, 4]) == SCORE_COPIES * 2 * 64 * (64 - 16) * 4
