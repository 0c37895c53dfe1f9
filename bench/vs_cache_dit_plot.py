"""The docs' view of bench/vs_cache_dit.py's results: per family and PSNR floor, each system's fastest setting at
or above it (a markdown table), and a speed-quality scatter (an SVG, one panel per family; no plotting library).

    python bench/vs_cache_dit_plot.py [--floors 30,40] [--svg docs/img/vs_cache_dit.svg]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
SYSTEMS = {"diffusers+cache-dit": "#d95f02", "vidloom": "#1b9e77"}
INF_DB = 100.0
"""Where an output identical to the system's own uncached one is drawn (and ranked): above any finite PSNR here."""


def load(folder: Path = RESULTS) -> dict[str, dict[str, Any]]:
    """family -> its mid result (Wan's file predates the per-family names)."""
    out = {}
    for path in sorted(folder.glob("vs_cache_dit-*mid.json")):
        data = json.loads(path.read_text())
        out[data.get("family", "wan")] = data
    return out


def _db(row: dict[str, Any]) -> float:
    value = row.get("psnr_db")
    return INF_DB if value in ("inf", float("inf")) else float(value)


def reused(row: dict[str, Any]) -> bool:
    """Whether the row cached anything (one that did not is the plain run again: its speed-up is noise)."""
    return row.get("cached_steps", 0) + row.get("cfg_cached_steps", 0) + row.get("skipped_blocks", 0) > 0


def best(rows: list[dict[str, Any]], floor: float) -> dict[str, Any] | None:
    """The fastest row that cached something and whose PSNR against its own plain output is at least `floor`."""
    good = [r for r in rows if "psnr_db" in r and reused(r) and _db(r) >= floor]
    return min(good, key=lambda r: r["wall_s"]) if good else None


def table(results: dict[str, dict[str, Any]], floors: list[float]) -> str:
    lines = ["| family | PSNR floor | cache-dit: plain s, best s (speed-up, setting) | "
             "vidloom: plain s, best s (speed-up, setting) | vidloom / cache-dit wall |",
             "| --- | --- | --- | --- | --- |"]
    for family, data in results.items():
        for floor in floors:
            cells, walls = [], []
            for system in SYSTEMS:
                rows = data["systems"].get(system, [])
                plain = next((r for r in rows if r["config"] == "plain" and "wall_s" in r), None)
                row = best(rows, floor)
                if plain is None:
                    cells.append("did not run")
                    walls.append(None)
                    continue
                wall = row["wall_s"] if row and row["wall_s"] < plain["wall_s"] else plain["wall_s"]
                walls.append(wall)
                if row is None or row["wall_s"] >= plain["wall_s"]:
                    cells.append(f"{plain['wall_s']:.1f}, no cached run faster than plain")
                else:
                    cells.append(f"{plain['wall_s']:.1f}, {row['wall_s']:.1f} ({row['speedup_vs_own_plain']:.2f}x, "
                                 f"{row['config']} @ {row['threshold']})")
            ratio = f"{walls[1] / walls[0]:.2f}" if None not in walls else "-"
            lines.append(f"| {family} | {floor:g} dB | {cells[0]} | {cells[1]} | {ratio} |")
    return "\n".join(lines)


def svg(results: dict[str, dict[str, Any]], width: int = 300, height: int = 220) -> str:
    """One panel per family: x the speed-up against the system's own plain run, y the PSNR against its own output."""
    pad, cols = 40, 3
    rows_n = math.ceil(len(results) / cols)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{cols * width}" height="{rows_n * height + 30}" '
             'font-family="sans-serif" font-size="11">', '<rect width="100%" height="100%" fill="white"/>']
    for i, (system, color) in enumerate(SYSTEMS.items()):
        parts.append(f'<circle cx="{20 + i * 170}" cy="12" r="4" fill="{color}"/>'
                     f'<text x="{28 + i * 170}" y="16">{system}</text>')
    for k, (family, data) in enumerate(results.items()):
        x0, y0 = (k % cols) * width, 30 + (k // cols) * height
        points = [(system, r["speedup_vs_own_plain"], _db(r)) for system in SYSTEMS
                  for r in data["systems"].get(system, []) if "psnr_db" in r]
        xs = [p[1] for p in points] or [1.0]
        lo, hi = min(0.5, min(xs)), max(2.0, max(xs))

        def at(x: float, y: float) -> tuple[float, float]:
            return (x0 + pad + (x - lo) / (hi - lo) * (width - 2 * pad),
                    y0 + height - pad - (min(y, INF_DB) / INF_DB) * (height - 2 * pad))

        left, bottom = at(lo, 0)
        right, top = at(hi, INF_DB)
        one, _ = at(1.0, 0)
        parts += [f'<rect x="{left}" y="{top}" width="{right - left}" height="{bottom - top}" fill="none" stroke="#999"/>',
                  f'<line x1="{one}" y1="{top}" x2="{one}" y2="{bottom}" stroke="#ccc" stroke-dasharray="3"/>',
                  f'<text x="{x0 + width / 2}" y="{top - 6}" text-anchor="middle" font-weight="bold">'
                  f'{family} ({data["steps"]} steps)</text>',
                  f'<text x="{x0 + width / 2}" y="{bottom + 26}" text-anchor="middle">speed-up vs own plain '
                  f'({lo:g}-{hi:.1f}x)</text>',
                  f'<text x="{left - 4}" y="{top + 4}" text-anchor="end">inf</text>',
                  f'<text x="{left - 4}" y="{bottom}" text-anchor="end">0 dB</text>']
        for system, x, y in points:
            cx, cy = at(x, y)
            parts.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="3" fill="{SYSTEMS[system]}" fill-opacity="0.7"/>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--floors", default="30,40", help="PSNR floors in dB, comma-separated")
    parser.add_argument("--svg", type=Path, default=Path(__file__).resolve().parents[1] / "docs/img/vs_cache_dit.svg")
    args = parser.parse_args(argv)
    results = load()
    print(table(results, [float(f) for f in args.floors.split(",")]))
    args.svg.write_text(svg(results))
    print(f"wrote {args.svg}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
