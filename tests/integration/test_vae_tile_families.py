"""`vae_tile` reaches every family's decode: tiles change the seams only (the VAE-level matches with diffusers'
tiling are tests/parity/test_ltx2_video_vae.py, test_cosmos3_vae_tiling.py, test_flux2_modules.py and
test_stable_audio_vae_tiling.py; Helios' through its whole pipeline, test_helios_generation.py), and a tile that
covers the whole output is the plain decode exactly.

Tiled vs untiled output on these tiny random VAEs (measured on CPU, uint8 frames; bounds ~3 dB lower), max abs diff
in brackets: LTX-2 29.9 dB [65] (tile 96, stride 64, 128x128), Cosmos3 21.8 dB [142] (48/32, 64x64), Flux2 23.7 dB
[95] (32/24, 64x64), AnyFlow-FAR 17.6 dB [223] (48/32, 64x64, chunked decode), Helios 15.8 dB [237] (32/16, 32x48,
one 33-frame chunk), SANA-WM 18.7 dB [172] (96/64, 128x128), Stable Audio 23.0 dB against the waveform's peak [0.12]
(64/32 samples). Random decoders saturate, so a seam pixel may flip far; the VAE-level parity tests above are the
exactness checks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from tests.helpers.cosmos3_checkpoints import COSMOS3_A, write_tiny_cosmos3
from tests.helpers.far_checkpoints import FAR_A, write_tiny_far
from tests.helpers.flux2_checkpoints import TINY_BASE, write_tiny_flux2
from tests.helpers.helios_checkpoints import TINY_A as HELIOS_A, write_tiny_helios
from tests.helpers.ltx2_checkpoints import CONFIGS as LTX2_CONFIGS, write_tiny_ltx2
from tests.helpers.sana_wm_checkpoints import SANA_WM_A, write_tiny_sana_wm
from tests.helpers.stable_audio_checkpoints import TINY_STEREO, write_tiny_stable_audio
from tests.integration.test_denoiser_acceleration import psnr
from vidloom.core.deploy import DeployConfig
from vidloom.core.request import GenerationRequest, Task
from vidloom.generator import VideoGenerator

IMAGE = Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 70, 3), dtype=np.uint8))

# family -> (writer, request, (tile, stride) that splits the output, a tile covering it, least PSNR of tiled vs plain)
CASES: dict[str, tuple[Any, dict[str, Any], tuple[int, int], int, float]] = {
    "ltx2": (lambda d: write_tiny_ltx2(d, LTX2_CONFIGS[0]),
             dict(height=128, width=128, num_frames=9, fps=25, num_inference_steps=2), (96, 64), 128, 26.5),
    "cosmos3": (lambda d: write_tiny_cosmos3(d, COSMOS3_A),
                dict(height=64, width=64, num_frames=9, fps=16, num_inference_steps=2), (48, 32), 64, 18.5),
    "flux2": (lambda d: write_tiny_flux2(d, TINY_BASE),
              dict(task=Task.T2I, height=64, width=64, num_frames=1, num_inference_steps=2), (32, 24), 64, 20.5),
    "anyflow-far": (lambda d: write_tiny_far(d, FAR_A),
                    dict(height=64, width=64, num_frames=9, num_inference_steps=2), (48, 32), 64, 14.5),
    # One 33-frame chunk, decoded on its own (each chunk is; tests/parity/test_helios_generation.py runs two).
    "helios": (lambda d: write_tiny_helios(d, HELIOS_A),
               dict(height=32, width=48, num_frames=33, num_inference_steps=2), (32, 16), 48, 12.5),
    "sana-wm": (lambda d: write_tiny_sana_wm(d, SANA_WM_A),
                dict(height=128, width=128, num_frames=9, num_inference_steps=2, image=[IMAGE],
                     intrinsics=[50.0, 52.0, 35.0, 20.0], camera="w-8"), (96, 64), 128, 15.5),
    # Waveform samples: the tiny Oobleck hop is 8 and its window 32 latent steps (256 samples).
    "stable-audio": (lambda d: write_tiny_stable_audio(d, TINY_STEREO),
                     dict(task=Task.T2A, num_inference_steps=2, seconds=1.0), (64, 32), 256, 20.0),
}


def _output(folder: Path, kind: str, request: dict[str, Any], **deploy: Any) -> np.ndarray:
    gen = VideoGenerator.from_pretrained(folder, device="cpu", deploy=DeployConfig(**deploy))
    out = gen.run(GenerationRequest(prompt="a red fox jumps", negative_prompt="blurry", seed=3, guidance_scale=3.0,
                                    **request))
    return np.asarray(out.audio, dtype=np.float64) if kind == "stable-audio" else out.frames  # frames: uint8


@pytest.mark.parametrize("kind", sorted(CASES))
def test_tiled_decode_through_the_program(kind, tmp_path):
    writer, request, (tile, stride), whole, least_db = CASES[kind]
    folder = writer(tmp_path / kind)
    plain = _output(folder, kind, request)
    tiled = _output(folder, kind, request, vae_tile=tile, vae_tile_stride=stride)
    assert tiled.shape == plain.shape and not np.array_equal(tiled, plain)  # the tiles really ran
    value = _psnr_audio(tiled, plain) if kind == "stable-audio" else psnr(tiled, plain)
    diff = np.abs(tiled.astype(np.float64) - plain.astype(np.float64)).max()
    print(f"{kind} vae_tile {tile}/{stride}: {value:.1f} dB, max abs {diff:.4g}")
    assert value > least_db
    assert np.array_equal(_output(folder, kind, request, vae_tile=whole, vae_tile_stride=whole), plain)


def _psnr_audio(a: np.ndarray, b: np.ndarray) -> float:
    """Against the reference waveform's own peak (a random VAE's waveform is not in [-1, 1])."""
    peak = float(np.abs(b).max())
    return float(10 * np.log10(peak ** 2 / max(np.mean((a - b) ** 2), 1e-20)))
