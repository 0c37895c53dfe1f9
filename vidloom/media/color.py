"""RGB -> encoder pixel formats in numpy, so every encode sees bit-identical input.

Why not let PyAV convert: an encoder's built-in conversion (PyAV's VideoReformatter,
called with the codec's thread count) gave different YUV planes for the same RGB frames
depending on what the process had done before (issue 17: the same frames encoded to mp4
in one process gave 15,000 or 15,029 bytes, decoded frames differing by up to 16 levels),
while a fresh process always agreed. Converting here makes the encoder input a pure
function of the frames.
"""

from __future__ import annotations

import numpy as np

# BT.601 limited range ("studio swing"), the matrix libswscale uses by default for
# rgb24 -> yuv420p and that decoders assume for untagged SD video. Rows: Y, Cb, Cr;
# coefficients from ITU-R BT.601-7 scaled to 8-bit limited range (219 luma, 224 chroma levels).
_BT601 = np.array([
    [65.481, 128.553, 24.966],
    [-37.797, -74.203, 112.0],
    [112.0, -93.786, -18.214],
]) / 255.0
_OFFSET = np.array([16.0, 128.0, 128.0])


def rgb_to_yuv420p(frame: np.ndarray) -> np.ndarray:
    """uint8 [H, W, 3] RGB (H, W even) -> the [H * 3 / 2, W] uint8 layout PyAV's yuv420p frames take.

    Chroma is the 2x2 mean of the RGB block converted once (the matrix is linear, so this
    equals averaging the per-pixel chroma).
    """
    height, width, _ = frame.shape
    rgb = frame.astype(np.float64)
    luma = rgb @ _BT601[0] + _OFFSET[0]
    block = rgb.reshape(height // 2, 2, width // 2, 2, 3).mean(axis=(1, 3))
    cb = block @ _BT601[1] + _OFFSET[1]
    cr = block @ _BT601[2] + _OFFSET[2]
    planes = [luma.reshape(-1), cb.reshape(-1), cr.reshape(-1)]
    flat = np.clip(np.rint(np.concatenate(planes)), 0, 255).astype(np.uint8)
    return flat.reshape(height * 3 // 2, width)


def web_palette() -> np.ndarray:
    """A fixed 6x7x6 RGB cube (252 colours, 4 unused) as the [256, 4] ARGB table pal8 frames take."""
    reds, greens, blues = np.linspace(0, 255, 6), np.linspace(0, 255, 7), np.linspace(0, 255, 6)
    cube = np.stack(np.meshgrid(reds, greens, blues, indexing="ij"), axis=-1).reshape(-1, 3)
    palette = np.zeros((256, 4), dtype=np.uint8)
    palette[:, 0] = 255
    palette[: len(cube), 1:] = np.rint(cube).astype(np.uint8)
    return palette


def rgb_to_palette_indices(frame: np.ndarray) -> np.ndarray:
    """uint8 [H, W, 3] -> uint8 [H, W] indices into web_palette() (nearest level per channel)."""
    levels = np.array([5, 6, 5], dtype=np.float64)
    index = np.rint(frame.astype(np.float64) / 255.0 * levels).astype(np.int64)
    return (index[..., 0] * 42 + index[..., 1] * 6 + index[..., 2]).astype(np.uint8)
