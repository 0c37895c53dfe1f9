"""A tiled decode's peak host memory is below the whole decode's, for every family's VAE class (fresh processes:
tests/helpers/decode_peak.py, VmHWM). Measured on CPU (bench/results/vae_tile_memory.json, 2 rounds), whole -> tiled:
Wan 135.4 -> 33.0 MiB, AnyFlow-FAR chunked 135.7 -> 104.8, Helios (one 33-frame chunk of 256x256) 111.3 -> 82.2,
Flux2 115.4 -> 18.1, LTX-2/SANA-WM 95.7 -> 24.6, Stable Audio 112.1 -> 30.2 (printed with -s). Helios' tiled chunk
is below its whole one because each tile blends into the output as it is decoded (layers.tiling); holding every
tile's output until the blend, it peaked at 128.7 MiB. Only the order is asserted; the figures are reported."""

from __future__ import annotations

import pytest

from tests.helpers.decode_peak import TILES, probe


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(TILES))
def test_tiled_decode_peaks_below_the_whole_decode(family):
    tile, stride = TILES[family]
    whole, tiled = probe(family, 0, 0), probe(family, tile, stride)
    assert whole["output_shape"] == tiled["output_shape"]
    print(f"{family}: whole {whole['peak_bytes'] / 2**20:.1f} MiB, tiled {tile}/{stride} "
          f"{tiled['peak_bytes'] / 2**20:.1f} MiB (load {whole['loadavg'][0]:.1f})")
    assert tiled["peak_bytes"] < whole["peak_bytes"]
