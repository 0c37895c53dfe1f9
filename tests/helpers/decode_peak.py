"""Peak host memory of one VAE decode, whole or tiled, in a fresh interpreter (the vae_tile memory test's probe).

    python -m tests.helpers.decode_peak FAMILY TILE STRIDE   (TILE 0: untiled)

prints one JSON line {"family", "tile", "stride", "peak_bytes", "output_shape"}: the kernel's high-water mark
(VmHWM, reset through /proc/self/clear_refs after a warm-up decode) above the resident set before the decode.
Random-weight VAEs of each family's class at small widths, on a latent much larger than one tile.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch


def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"{key} not in /proc/self/status")


def _wan_vae() -> Any:
    """A random Wan2.1-layout VAE at small widths (Wan, AnyFlow-FAR and Helios decode with this class)."""
    from vidloom.models.wan.vae import WanVAE, WanVAEConfig

    return WanVAE(WanVAEConfig(base_dim=8, z_dim=4, dim_mult=(1, 2, 2, 2), num_res_blocks=1, latents_mean=(0.0,) * 4,
                               latents_std=(1.0,) * 4)).eval()


def _wan() -> tuple[Callable[[torch.Tensor, Any], torch.Tensor], torch.Tensor]:
    vae = _wan_vae()
    return lambda z, tiling: vae.decode(z, tiling=tiling), torch.randn(1, 4, 2, 40, 40)  # 5 frames of 320x320


def _helios() -> tuple[Callable[[torch.Tensor, Any], torch.Tensor], torch.Tensor]:
    """One Helios chunk (9 latent frames: 33 frames of 256x256) through the chunk loop's own decode."""
    from vidloom.families.helios.loop import CHUNK_LATENT_FRAMES, decode_chunk

    vae = _wan_vae()
    return lambda z, tiling: decode_chunk(vae, z, tiling), torch.randn(1, 4, CHUNK_LATENT_FRAMES, 32, 32)


def _far() -> tuple[Callable[[torch.Tensor, Any], torch.Tensor], torch.Tensor]:
    from vidloom.families.wan_causal.decode import new_stream

    vae = _wan_vae()

    def decode(z: torch.Tensor, tiling: Any) -> torch.Tensor:
        stream = new_stream(vae, tiling)
        return torch.cat([stream.decode(z[:, :, :1]), stream.decode(z[:, :, 1:])], dim=2)

    return decode, torch.randn(1, 4, 2, 40, 40)


def _flux2() -> tuple[Callable[[torch.Tensor, Any], torch.Tensor], torch.Tensor]:
    from vidloom.families.flux2.vae import Flux2VAE, Flux2VAEConfig

    vae = Flux2VAE(Flux2VAEConfig(block_out_channels=(8, 16, 16, 16), latent_channels=4, norm_num_groups=4)).eval()
    return lambda z, tiling: vae.decode(z, tiling), torch.randn(1, 16, 48, 48)  # 768x768


def _ltx2() -> tuple[Callable[[torch.Tensor, Any], torch.Tensor], torch.Tensor]:
    from vidloom.models.ltx2.video_vae import LTX2VideoVAE, LTX2VideoVAEConfig
    from vidloom.families.sana_wm.demo import DEMO_VAE

    vae = LTX2VideoVAE(LTX2VideoVAEConfig.from_diffusers(DEMO_VAE)).eval()
    return lambda z, tiling: vae.decode(z, tiling=tiling), torch.randn(1, 8, 2, 12, 12)  # 9 frames of 384x384


def _oobleck() -> tuple[Callable[[torch.Tensor, Any], torch.Tensor], torch.Tensor]:
    from vidloom.families.stable_audio.vae import OobleckDecoderConfig, OobleckVAE

    config = OobleckDecoderConfig(downsampling_ratios=(2, 4, 4, 4), channel_multiples=(1, 2, 2, 4), encoder_channels=16,
                                  channels=16, latent_channels=8)
    vae = OobleckVAE(config).eval()
    return lambda z, tiling: vae.decode(z, tiling), torch.randn(1, 8, 2048)  # 262144 samples


ROOT = Path(__file__).resolve().parents[2]
# family -> (tile, stride) in output units (pixels; audio: samples), well under the decoded size.
TILES: dict[str, tuple[int, int]] = {
    "wan": (128, 96), "anyflow-far": (128, 96), "helios": (128, 96), "flux2": (128, 96),
    "ltx2/sana-wm": (128, 96),
    "stable-audio": (32768, 24576),
}


# A fixed mmap threshold: glibc otherwise raises it after the first large free, and later tensors then come from
# a fragmenting heap whose high-water mark varied 2x between identical runs; above it every tensor is its own
# mapping, returned when freed, so VmHWM follows the live tensors.
MALLOC = {"MALLOC_MMAP_THRESHOLD_": "131072"}


def probe(family: str, tile: int, stride: int) -> dict[str, Any]:
    """`measure` in a fresh interpreter, with the load average when it started and its wall time."""
    load = os.getloadavg()
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "tests.helpers.decode_peak", family, str(tile), str(stride)],
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), **MALLOC}, capture_output=True, text=True,
                         check=True)
    row = json.loads(out.stdout.strip().splitlines()[-1])
    return {**row, "wall_s": round(time.perf_counter() - start, 2), "loadavg": load}


FAMILIES = {"wan": _wan, "anyflow-far": _far, "helios": _helios, "flux2": _flux2, "ltx2/sana-wm": _ltx2,
            "stable-audio": _oobleck}


@torch.no_grad()
def measure(family: str, tile: int, stride: int) -> dict[str, Any]:
    from vidloom.layers.tiling import SpatialTiling

    torch.set_num_threads(1)
    torch.manual_seed(0)
    decode, latents = FAMILIES[family]()
    tiling = SpatialTiling(tile=tile, stride=stride) if tile else None
    decode(latents[..., :8] if family == "stable-audio" else latents[..., :2, :2], None)  # warm-up
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    before = _status("VmRSS")
    out = decode(latents, tiling)
    return {"family": family, "tile": tile, "stride": stride, "peak_bytes": _status("VmHWM") - before,
            "output_shape": list(out.shape)}


if __name__ == "__main__":
    print(json.dumps(measure(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))))
