"""The world-model benchmarks run end to end at the tiny size (--tiny), as a user runs them (a subprocess: the
scripts pin torch to one thread), and what they measure is what they say: the same chunks on every path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _bench(script: str, tmp_path: Path, *args: str) -> dict:
    out = tmp_path / f"{script}.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / f"{script}.py"), "--tiny", "--cache",
                           str(tmp_path / "cache"), "--out", str(out), *args],
                          check=False, capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_world_session_bench_times_every_path_on_the_same_chunks(tmp_path: Path):
    result = _bench("world_session", tmp_path, "--chunks", "2", "--steps", "2")
    rows = result["rows"]
    assert sorted((r["chunk"], r["path"]) for r in rows) == [(k, p) for k in range(2)
                                                              for p in ("pipeline", "python", "websocket")]
    assert all(r["wall_s"] > 0 and r["cpu_s"] > 0 and "loadavg_1m" in r for r in rows)
    summary = result["summary"]
    assert summary["pipeline_over_python_steady_chunk"] > 0 and summary["websocket_over_python_steady_chunk"] > 0
    # Chunk 0 is the same call on every path (float32): the pipeline's frames within one uint8 level of the
    # session's; the WebSocket's JPEG (q90) of noise-like random-model frames within a few levels on average.
    assert result["frames"]["pipeline_vs_python_max_levels"][0] <= 1
    assert max(result["frames"]["websocket_jpeg_vs_python_mean_levels"]) <= 10
    assert result["config"]["vidloom_dtype"] == "torch.float32" and "loadavg_1m" in result["environment"]


def test_sana_wm_bench_streams_chunks_and_matches_the_reference(tmp_path: Path):
    result = _bench("sana_wm", tmp_path, "--rounds", "1")
    by = {r["engine"]: r for r in result["rows"]}
    assert set(by) == {"vidloom", "reference"}
    ours = by["vidloom"]
    assert ours["chunk_frames"] == [24, 16]  # 41 frames: the sink, then two refined chunks streamed
    assert 0 < ours["first_chunk_s"] < ours["total_s"]
    assert by["reference"]["first_chunk_s"] == by["reference"]["total_s"]  # frames only at the end
    assert result["frames"]["shape"] == result["frames"]["reference_shape"] == [40, 64, 96, 3]
    assert result["frames"]["max_uint8_levels"] <= 1
    assert result["summary"]["reference_total_over_vidloom_first_chunk"] > 0
