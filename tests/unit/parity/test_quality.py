"""PSNR, the fast path's quality measure."""

from __future__ import annotations

import math

import numpy as np
import pytest

from vidloom.parity.quality import psnr


def test_psnr_reads_uint8_on_255_and_floats_on_1():
    ref = np.zeros((2, 4, 4, 3), dtype=np.uint8)
    off = ref.copy()
    off[0, 0, 0, 0] = 255  # one sample off by full scale: mse = 255^2 / 96
    assert psnr(off, ref) == pytest.approx(10 * math.log10(96))
    assert psnr(off.astype(np.float32) / 255, ref.astype(np.float32)) == pytest.approx(10 * math.log10(96))
    assert psnr(ref, ref) == math.inf


def test_psnr_refuses_mismatched_or_empty_arrays():
    with pytest.raises(ValueError, match="shapes differ"):
        psnr(np.zeros((1, 2)), np.zeros((2, 1)))
    with pytest.raises(ValueError, match="empty"):
        psnr(np.zeros((0,)), np.zeros((0,)))
