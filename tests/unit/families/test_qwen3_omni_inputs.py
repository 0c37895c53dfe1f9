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
