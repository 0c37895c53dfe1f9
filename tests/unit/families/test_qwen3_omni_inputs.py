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
