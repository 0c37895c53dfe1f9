"""bench/vs_cache_dit.py: every family it offers runs through diffusers + cache-dit and through vidloom's DBCache on
one tiny checkpoint, each system caches and reports against its own uncached output (issue #36)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import checkpoints  # noqa: E402
from cache_dit_families import CACHE_DIT_FAILS, FAMILY_NAMES, NOT_RUN, target  # noqa: E402
from vs_cache_dit import PRESETS, SYSTEM_RUNS, Setting, main  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")
SMOKE = [(Setting(1, 0, 1), 0.3)]  # the --smoke setting


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_both_systems_run_the_smoke_setting_in_process(family, tmp_path, monkeypatch):
    pytest.importorskip("cache_dit")
    monkeypatch.setattr(checkpoints, "CACHE", tmp_path)
    tiny = target(family, "tiny")
    assert tiny.blocks() >= 2  # F1B0 leaves a middle block to cache
    for system, run in SYSTEM_RUNS.items():
        rows = run(tiny, tiny.checkpoint(), SMOKE, ())  # each preset is one more load; main's test below runs them
        assert [row["config"] for row in rows] == ["plain", "F1B0+T1"], rows
        if system == "diffusers+cache-dit" and family in CACHE_DIT_FAILS:  # said so in the docs, with this error
            assert CACHE_DIT_FAILS[family] in rows[1]["error"]
            rows = rows[:1]
        assert not [row for row in rows if "error" in row]
        assert all(row["wall_s"] > 0 for row in rows)
        # PSNR against the system's own uncached output: inf where nothing was cached, finite where something was.
        for row in rows[1:]:
            reused = row["cached_steps"] + row.get("cfg_cached_steps", 0) + row.get("skipped_blocks", 0)
            assert (row["psnr_db"] == float("inf")) == (reused == 0), (system, row)


def test_smoke_through_main_writes_the_family_json(tmp_path, monkeypatch):
    pytest.importorskip("cache_dit")
    monkeypatch.setattr(checkpoints, "CACHE", tmp_path / "cache")
    main(["--smoke", "--families", "qwen-image", "--quiet-wait", "0", "--out", str(tmp_path), "--what", "test"])
    result = json.loads((tmp_path / "vs_cache_dit-qwen-image-smoke.json").read_text())
    assert (result["family"], result["size"], result["steps"], result["what"]) == ("qwen-image", "tiny", 4, "test")
    for system in ("diffusers+cache-dit", "vidloom"):
        rows = result["systems"][system]
        assert rows[0]["config"] == "plain" and rows[0]["speedup_vs_own_plain"] == 1.0
        assert rows[1]["config"] == "F1B0+T1" and rows[1]["threshold"] == 0.3 and rows[1]["cached_steps"] >= 1
    assert [row["config"] for row in result["systems"]["vidloom"][2:]] == list(PRESETS)


@pytest.mark.parametrize("family", ["nope", *NOT_RUN])
def test_an_unknown_or_unsupported_family_is_a_usage_error_naming_the_flag(family, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--families", family])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "--families" in err
    if family in NOT_RUN:
        assert NOT_RUN[family] in err


def test_a_family_other_than_wan_refuses_a_wan_only_size():
    with pytest.raises(SystemExit, match="--size"):
        target("flux2", "real-1.3b")
