"""PSNR between two renders of the same request: the quality gate of every fast-path setting.

A faster setting (bfloat16 on CPU, a compiled graph, a cache) changes the arithmetic, not the request, so
its output is compared against the float32 output of the same seed; the default fast path must stay at or
above `FAST_PATH_MIN_PSNR_DB` (docs/performance-cpu.md).
"""

from __future__ import annotations

import numpy as np

FAST_PATH_MIN_PSNR_DB = 35.0


def psnr(ours: np.ndarray, reference: np.ndarray) -> float:
    """Peak signal-to-noise ratio in dB; uint8 frames are read on [0, 255], float frames on [0, 1]; inf if equal.

    The shapes must match: a setting that changes the output's shape is not a faster path to the same output.
    """
    if ours.shape != reference.shape:
        raise ValueError(f"psnr: shapes differ, {ours.shape} vs {reference.shape}")
    if ours.size == 0:
        raise ValueError("psnr: empty arrays")
    peak = 255.0 if ours.dtype == np.uint8 and reference.dtype == np.uint8 else 1.0
    diff = ours.astype(np.float64) - reference.astype(np.float64)
    mse = float(np.mean(diff * diff))
    return float("inf") if mse == 0 else float(10.0 * np.log10(peak * peak / mse))


def waveform_snr(ours: np.ndarray, reference: np.ndarray) -> float:
    """Signal-to-noise ratio in dB of a waveform against the reference one (the audio side of `psnr`); inf if equal.

    Audio has no fixed peak, so the reference's own energy is the signal; the same gate (35 dB) applies.
    """
    if ours.shape != reference.shape:
        raise ValueError(f"waveform_snr: shapes differ, {ours.shape} vs {reference.shape}")
    if ours.size == 0:
        raise ValueError("waveform_snr: empty arrays")
    signal = float(np.sum(reference.astype(np.float64) ** 2))
    noise = float(np.sum((ours.astype(np.float64) - reference.astype(np.float64)) ** 2))
    if noise == 0:
        return float("inf")
    return float(10.0 * np.log10(signal / noise)) if signal > 0 else float("-inf")
