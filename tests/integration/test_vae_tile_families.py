"""`vae_tile` reaches LTX-2's and Cosmos3's decode: tiles change the seams only (the VAE-level match with diffusers'
`enable_tiling` is tests/parity/test_ltx2_video_vae.py and tests/parity/test_cosmos3_vae_tiling.py, 1e-4), and a
tile that covers the whole frame is the plain decode exactly. Tiled vs untiled frames on these tiny random VAEs:
LTX-2 29.9 dB (tile 96, stride 64, 128x128), Cosmos3 21.8 dB (tile 48, stride 32, 64x64); bounds ~3 dB lower."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.helpers.cosmos3_checkpoints import COSMOS3_A, write_tiny_cosmos3
from tests.helpers.ltx2_checkpoints import CONFIGS as LTX2_CONFIGS, write_tiny_ltx2
from tests.integration.test_denoiser_acceleration import psnr
from vidloom.core.deploy import DeployConfig
from vidloom.core.request import GenerationRequest
from vidloom.generator import VideoGenerator

# family -> (writer, request, (tile, stride) that splits the frame, a tile covering it, least PSNR of tiled vs plain)
CASES: dict[str, tuple[Any, dict[str, Any], tuple[int, int], int, float]] = {
    "ltx2": (lambda d: write_tiny_ltx2(d, LTX2_CONFIGS[0]),
             dict(height=128, width=128, num_frames=9, fps=25, num_inference_steps=2), (96, 64), 128, 26.5),
    "cosmos3": (lambda d: write_tiny_cosmos3(d, COSMOS3_A),
                dict(height=64, width=64, num_frames=9, fps=16, num_inference_steps=2), (48, 32), 64, 18.5),
}


def _frames(folder: Path, request: dict[str, Any], **deploy: Any) -> np.ndarray:
    gen = VideoGenerator.from_pretrained(folder, device="cpu", deploy=DeployConfig(**deploy))
    return gen.run(GenerationRequest(prompt="a red fox jumps", negative_prompt="blurry", seed=3, guidance_scale=3.0,
                                     **request)).frames


@pytest.mark.parametrize("kind", sorted(CASES))
def test_tiled_decode_through_the_program(kind, tmp_path):
    writer, request, (tile, stride), whole, least_db = CASES[kind]
    folder = writer(tmp_path / kind)
    plain = _frames(folder, request)
    tiled = _frames(folder, request, vae_tile=tile, vae_tile_stride=stride)
    assert tiled.shape == plain.shape and not np.array_equal(tiled, plain)  # the tiles really ran
    value = psnr(tiled, plain)
    print(f"{kind} vae_tile {tile}/{stride}: {value:.1f} dB vs untiled")
    assert value > least_db
    assert np.array_equal(_frames(folder, request, vae_tile=whole, vae_tile_stride=whole), plain)
