"""bench/parallel_families.py: every plan of a family runs on a fresh pool and agrees with the first (issue #35)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import checkpoints  # noqa: E402
import parallel  # noqa: E402
import parallel_families  # noqa: E402
from family_bench import FamilyBench  # noqa: E402
from parallel_families import GENERATION, main, table_rows  # noqa: E402

from tests.helpers.flux2_checkpoints import TINY_BASE, write_tiny_flux2  # noqa: E402


def test_every_generation_family_is_offered_and_chat_rows_are_not():
    assert {"wan2.1-mid", "ltx2-mid", "flux2-klein-mid", "helios-mid", "qwen-image-mid"} <= set(GENERATION)
    assert not any("chat" in name for name in GENERATION)


def test_plans_run_agree_and_a_refused_plan_is_a_row(tmp_path, monkeypatch):
    monkeypatch.setattr(parallel, "QUIET_WAIT_S", 0.0)  # the suite's machine is never quiet
    monkeypatch.setattr(checkpoints, "CACHE", tmp_path / "cache")
    # Guidance 1.0: no unconditional branch, so the CFG plan has nothing to split and is refused at submit.
    bench = FamilyBench("klein-tiny", lambda folder: write_tiny_flux2(folder, TINY_BASE), "Flux2KleinPipeline",
                        dict(height=64, width=64, num_frames=1, steps=1, guidance=1.0))
    monkeypatch.setitem(parallel_families.FAMILIES, bench.name, bench)
    monkeypatch.setattr(parallel_families, "GENERATION", (bench.name,))
    out = tmp_path / "result.json"
    main(["--families", bench.name, "--plans", "1,sp2,cfg2", "--steps", "1", "--json", str(out)])
    result = json.loads(out.read_text())["families"][bench.name]
    assert result["request"]["steps"] == 1
    one, sp2, cfg2 = rows = result["plans"]
    assert one["processes"] == 1 and one["max_abs_diff_vs_first"] == 0.0 and len(one["rank_peak_rss_mib"]) == 1
    assert sp2["processes"] == 2 and sp2["max_abs_diff_vs_first"] <= 1e-4  # float32 frames in [0, 1]
    assert len(sp2["rank_peak_rss_mib"]) == 2 and all(v > 0 for v in sp2["rank_peak_rss_mib"])
    assert "guidance" in cfg2["refused"]
    printed = table_rows(bench.name, rows)
    assert [r[1] for r in printed] == ["1", "sp2", "cfg2"] and printed[1][5].endswith("x")


@pytest.mark.parametrize("argv, needle", [(["--families", "nope"], "--families"), (["--plans", "sp3"], "--plans")])
def test_a_bad_name_is_a_usage_error_naming_the_flag(argv, needle, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2 and needle in capsys.readouterr().err
