"""`vae_tile` memory: peak host memory of one decode, whole vs tiled, for every family's VAE class.

Each measurement is a fresh process (tests/helpers/decode_peak.py: VmHWM above the resident set, after a warm-up
decode), random-weight VAEs at small widths on a latent much larger than one tile. Whole and tiled alternate
(A, B, A, B per family, --rounds times); the JSON (bench/results/vae_tile_memory.json) keeps every run, the
load average when it started, and per family the ratio tiled / whole of the smallest peaks. Memory, not time:
the load moves only the wall time, recorded next to it.

    python bench/vae_tile_memory.py [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.helpers.decode_peak import TILES, probe  # noqa: E402


def run(rounds: int, families: list[str]) -> dict[str, Any]:
    runs = []
    for _ in range(rounds):
        for family in families:
            tile, stride = TILES[family]
            runs.append(probe(family, 0, 0))
            runs.append(probe(family, tile, stride))
    summary = {}
    for family in families:
        whole = min(r["peak_bytes"] for r in runs if r["family"] == family and r["tile"] == 0)
        tiled = min(r["peak_bytes"] for r in runs if r["family"] == family and r["tile"])
        summary[family] = {"whole_mib": round(whole / 2**20, 1), "tiled_mib": round(tiled / 2**20, 1),
                           "tile": TILES[family], "ratio_tiled_over_whole": round(tiled / whole, 3)}
    return {"runs": runs, "summary": summary, "cpu_count": os.cpu_count()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--families", default=",".join(TILES))
    args = parser.parse_args()
    result = run(args.rounds, args.families.split(","))
    path = ROOT / "bench" / "results" / "vae_tile_memory.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["summary"], indent=1))


if __name__ == "__main__":
    main()
