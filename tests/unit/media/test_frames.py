"""Float frames to uint8 in one place: clamping, half-to-even rounding, and the same bytes on the device,
on the host and for a float input image."""

import numpy as np
import pytest
import torch

from vidloom.media.frames import to_uint8
from vidloom.media.image import load_image

# 0.5 * 255 = 127.5 rounds to even (128); 0.5/255 scales back to 0.5 and rounds to 0; 1.5/255 to 2.
FLOATS = [-0.5, 0.0, 0.4 / 255, 0.5 / 255, 1.5 / 255, 0.5, 254.5 / 255, 1.0, 2.0]
BYTES = [0, 0, 0, 0, 2, 128, 254, 255, 255]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_arrays_clamp_scale_and_round_half_to_even(dtype):
    got = to_uint8(np.array(FLOATS, dtype=dtype))
    assert got.dtype == np.uint8 and got.tolist() == BYTES


def test_tensors_give_the_same_bytes_and_stay_tensors():
    for dtype in (torch.float32, torch.float64):  # scaled in float32 whatever came in
        got = to_uint8(torch.tensor(FLOATS, dtype=dtype))
        assert got.dtype == torch.uint8 and got.tolist() == BYTES


def test_tensor_conversion_matches_numpy_bytes_including_ties_and_clipping():
    gen = torch.Generator().manual_seed(0)
    frames = torch.rand(3, 8, 10, 3, generator=gen) * 1.2 - 0.1  # some values outside [0, 1]
    frames[0, 0, :4, 0] = torch.tensor([0.5, 1.5, 2.5, 254.5]) / 255.0  # halves round to even in both
    expected = to_uint8(frames.numpy())
    got = to_uint8(frames)
    assert isinstance(got, torch.Tensor) and got.is_contiguous()
    assert np.array_equal(got.numpy(), expected)


def test_uint8_frames_pass_through_unchanged():
    array = np.arange(256, dtype=np.uint8)
    assert to_uint8(array) is array
    tensor = torch.arange(256, dtype=torch.uint8)
    assert to_uint8(tensor) is tensor


def test_permuted_frames_come_out_contiguous():
    video = torch.rand(3, 2, 4, 6)  # [C, F, H, W] as the VAE decodes
    got = to_uint8(video.permute(1, 2, 3, 0))
    assert got.is_contiguous() and got.shape == (2, 4, 6, 3)


def test_a_float_input_image_gets_the_output_bytes():
    pixels = np.random.default_rng(0).random((6, 8, 3)).astype(np.float32)
    pixels[0, :3, 0] = np.array([0.5, 1.5, 254.5], dtype=np.float32) / 255.0
    assert np.array_equal(np.asarray(load_image(pixels, "image")), to_uint8(pixels))
