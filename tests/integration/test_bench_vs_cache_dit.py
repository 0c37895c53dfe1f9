"""bench/vs_cache_dit.py: every family it offers runs through diffusers + cache-dit and through vidloom's DBCache on
one tiny checkpoint, each system caches and reports against its own uncached output (issue #36)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import checkpoints  # noqa: E402
from cache_dit_families import CACHE_DIT_FAILS, FAMILY_NAMES, NOT_RUN, target  # noqa: E402
from vs_cache_dit import PRESETS, SYSTEM_RUNS, Setting, main  # noqa: E402

# One intra-op thread (tests/conftest.py): the tiny runs are checked for what they report, not for their speed.
pytestmark = [pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning"),
              pytest.mark.usefixtures("one_torch_thread")]
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


def test_stable_audio_both_sides_give_the_same_mapped_waveform(tmp_path, monkeypatch):
    """Stable Audio's compared arrays are waveforms mapped to [0, 1] alike (family_bench.unit_audio): the reference
    call's and vidloom's have one shape and match to the family's float32 parity bound (1e-5 on the waveform,
    tests/parity/test_stable_audio_generation.py; half that mapped), so each system's PSNR reads the same scale."""
    import diffusers
    import torch

    from vidloom.generator import VideoGenerator

    monkeypatch.setattr(checkpoints, "CACHE", tmp_path)
    tiny = target("stable-audio", "tiny")
    pipe = diffusers.StableAudioPipeline.from_pretrained(str(tiny.checkpoint()), dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    theirs = tiny.call_reference(pipe, tiny.steps)
    engine = VideoGenerator.from_pretrained(tiny.checkpoint(), device="cpu", dtype="float32").engine
    ours = tiny.bench.vidloom_output(engine.run(tiny.vidloom_request(tiny.steps, None)))
    assert ours.dtype == theirs.dtype == np.float32
    assert ours.shape == theirs.shape == (2, 256)  # stereo, the request's 1 s at the tiny VAE's 256 Hz
    assert float(np.abs(ours - theirs).max()) <= 0.5e-5
    assert 0.0 < float(ours.min()) and float(ours.max()) < 1.0 and float(ours.std()) > 1e-3  # sound, within [-1, 1]


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


def test_the_docs_table_takes_each_systems_fastest_row_at_or_above_the_floor_and_the_plot_draws_every_row():
    from vs_cache_dit_plot import best, svg, table

    rows = {"diffusers+cache-dit": [{"config": "plain", "wall_s": 10.0},
                                    {"config": "F1B0", "threshold": 0.5, "wall_s": 6.0, "psnr_db": 25.0,
                                     "speedup_vs_own_plain": 1.67, "cached_steps": 3, "cfg_cached_steps": 3},
                                    {"config": "F4B1", "threshold": 0.5, "wall_s": 8.0, "psnr_db": 35.0,
                                     "speedup_vs_own_plain": 1.25, "cached_steps": 1, "cfg_cached_steps": 0},
                                    {"config": "F8B1", "threshold": 0.1, "wall_s": 4.0, "psnr_db": "inf",
                                     "speedup_vs_own_plain": 2.5, "cached_steps": 0, "cfg_cached_steps": 0}],
            "vidloom": [{"config": "plain", "wall_s": 5.0},
                        {"config": "F1B0", "threshold": 0.2, "wall_s": 5.5, "psnr_db": 60.0,
                         "speedup_vs_own_plain": 0.91, "cached_steps": 0, "skipped_blocks": 2}]}
    assert best(rows["diffusers+cache-dit"], 30)["config"] == "F4B1"  # F8B1 cached nothing: the plain run again
    assert best(rows["diffusers+cache-dit"], 20)["config"] == "F1B0"
    assert best(rows["diffusers+cache-dit"], 40) is None
    text = table({"fam": {"steps": 8, "systems": rows}}, [30.0])
    # cache-dit's best at >= 30 dB is F4B1 at 8.0 s; vidloom's cached row is slower than its plain 5.0 s: 5.0 / 8.0.
    assert "8.0 (1.25x, F4B1 @ 0.5)" in text and "no cached run faster than plain" in text and "| 0.62 |" in text
    assert svg({"fam": {"steps": 8, "systems": rows}}).count("<circle") == 2 + 4  # legend + every setting's row
