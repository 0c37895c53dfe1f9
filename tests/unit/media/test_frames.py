"""Frames to uint8 on the device gives the same bytes as the host-side conversion."""

import numpy as np
import torch

from vidloom.media.video import frames_to_uint8, to_uint8


def test_tensor_conversion_matches_numpy_bytes_including_ties_and_clipping():
    gen = torch.Generator().manual_seed(0)
    frames = torch.rand(3, 8, 10, 3, generator=gen) * 1.2 - 0.1  # some values outside [0, 1]
    ties = torch.tensor([0.5, 1.5, 2.5, 254.5]) / 255.0  # halves round to even in both
    frames[0, 0, :4, 0] = ties
    expected = to_uint8(frames.numpy())
    got = frames_to_uint8(frames)
    assert got.dtype == torch.uint8 and got.is_contiguous()
    assert np.array_equal(got.numpy(), expected)
    assert np.array_equal(to_uint8(expected), expected)  # uint8 frames pass through unchanged


def test_permuted_frames_come_out_contiguous():
    video = torch.rand(3, 2, 4, 6)  # [C, F, H, W] as the VAE decodes
    got = frames_to_uint8(video.permute(1, 2, 3, 0))
    assert got.is_contiguous() and got.shape == (2, 4, 6, 3)
