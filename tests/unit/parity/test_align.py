"""The aligner: the first tap past tolerance in our order, shape and NaN mismatches, the report's table."""

from __future__ import annotations

import math

import pytest
import torch

from vidloom.parity.align import Tolerance, align, compare
from vidloom.parity.taps import TapFilter, TapKey, TapRecorder


def _recorder(values: dict[str, list[float]], extra: dict[tuple[int, str], list[float]] | None = None) -> TapRecorder:
    """Two steps of one call each: block taps b0, b1, then the latents; `extra` overrides (step, name)."""
    rec = TapRecorder()
    for step in range(2):
        rec.begin_step("denoise", step)
        rec.begin_call()
        for name, value in values.items():
            rec.record("block", name, torch.tensor((extra or {}).get((step, name), value)))
        rec.end_step()
    rec.record("stage", "decode.video", torch.tensor([0.5, 0.5]))
    return rec


BASE = {"b0": [1.0, 2.0], "b1": [10.0, -20.0]}


def test_matching_recordings_report_no_divergence():
    report = align(_recorder(BASE), _recorder(BASE))
    assert report.ok and report.first_divergence is None
    assert len(report.diffs) == 5
    assert report.summary().startswith("parity: no divergence over 5 taps")


def test_first_divergence_is_the_earliest_tap_past_its_bound_in_our_order():
    ours = _recorder(BASE, {(1, "b0"): [1.0, 2.01], (1, "b1"): [10.0, -19.0]})
    report = align(ours, _recorder(BASE))
    first = report.first_divergence
    assert first is not None and first.key == TapKey("block", "b0", "denoise", 1, 0)
    assert first.max_abs == pytest.approx(0.01, rel=1e-5)
    assert first.bound == pytest.approx(1e-4 + 1e-4 * 2.0)
    assert first.relative == pytest.approx(0.005, rel=1e-4)
    assert "first divergence at denoise step 1 call 0 block b0: max abs diff 1.000e-02" in report.summary()


def test_relative_tolerance_scales_with_the_reference_magnitude():
    ours = _recorder(BASE, {(0, "b1"): [10.0005, -20.0]})  # 5e-4 off a tap of scale 20
    assert align(ours, _recorder(BASE), Tolerance(atol=1e-4, rtol=1e-4)).ok  # bound 2.1e-3
    assert not align(ours, _recorder(BASE), Tolerance(atol=1e-4, rtol=0.0)).ok


def test_shape_mismatch_and_nan_diverge():
    key = TapKey("stage", "x")
    shape = compare(key, torch.zeros(2, 3), torch.zeros(3, 2), Tolerance())
    assert shape.diverged and "shape (2, 3) vs reference (3, 2)" in shape.describe()
    nan = compare(key, torch.tensor([math.nan]), torch.tensor([1.0]), Tolerance())
    assert nan.diverged


def test_stage_taps_only_we_record_are_listed_not_compared():
    ours = _recorder(BASE)
    ours.record("stage", "encode_text.prompt_embeds", torch.zeros(1))
    report = align(ours, _recorder(BASE))
    assert report.ok and report.unmatched == []
    assert [k.name for k in report.only_ours] == ["encode_text.prompt_embeds"]
    assert "only in vidloom (not compared): 1 taps: stage encode_text.prompt_embeds" in report.format()


def test_step_taps_one_side_lacks_fail_the_report():
    # A block list or input the map misses must not pass as "no divergence".
    report = align(_recorder(BASE), _recorder({"b0": BASE["b0"]}))
    assert report.first_divergence is None and not report.ok
    assert [k.label() for k in report.unmatched] == ["denoise step 0 call 0 block b1", "denoise step 1 call 0 block b1"]
    assert report.summary().startswith("parity: 2 step taps were recorded on one side only, from denoise step 0")


def test_table_has_one_row_per_step_and_marks_the_diverged_one():
    ours = _recorder(BASE, {(1, "b1"): [11.0, -20.0]})
    lines = align(ours, _recorder(BASE)).format().splitlines()
    rows = {line.split("  ")[0].strip(): line for line in lines[3:]}
    assert set(rows) == {"denoise step 0", "denoise step 1", "stages"}
    assert rows["denoise step 0"].endswith("ok")
    assert "call 0 block b1" in rows["denoise step 1"] and rows["denoise step 1"].endswith("DIVERGED (1)")


def test_budget_notes_reach_the_report():
    small = TapRecorder(TapFilter(max_bytes=8))
    small.record("stage", "a", torch.zeros(2))
    small.record("stage", "b", torch.zeros(2))
    report = align(small, _recorder(BASE))
    assert any("vidloom dropped 1 taps" in note and "stage b" in note for note in report.notes)


def test_tolerance_refuses_negative_bounds():
    with pytest.raises(ValueError, match="tolerance: atol and rtol must be >= 0"):
        Tolerance(atol=-1.0)


def _record_ids(rec: TapRecorder, loop: str, ids: list[int]) -> None:
    """One decoded id per step of `loop`, as a decode loop's taps record them."""
    for position, value in enumerate(ids):
        rec.begin_step(loop, position)
        rec.record("token", "id", torch.tensor([value]))
        rec.end_step()


def test_ids_are_compared_exactly_and_named_with_both_values():
    """A relative bound would pass id 100001 for 100000; ids get none, and the report shows both."""
    ours, theirs = TapRecorder(), TapRecorder()
    for rec, ids in ((ours, [7, 100000, 3]), (theirs, [7, 100001])):
        _record_ids(rec, "thinker", ids)
    report = align(ours, theirs, Tolerance(atol=1e-4, rtol=1e-4))
    first = report.first_divergence
    assert first is not None and first.key == TapKey("token", "id", "thinker", 1)
    assert first.bound == 0.0
    assert report.summary() == "parity: first divergence at thinker step 1 token id: ours [100000], reference [100001]"
    assert "thinker ids" in report.format() and not report.ok
    same = align(theirs, theirs)
    assert same.ok and "no divergence" in same.summary()


def test_a_longer_id_sequence_on_one_side_is_said():
    ours, theirs = TapRecorder(), TapRecorder()
    for rec, ids in ((ours, [7, 8, 9]), (theirs, [7, 8])):
        _record_ids(rec, "talker", ids)
    report = align(ours, theirs)
    assert not report.ok
    assert report.summary().startswith("parity: every compared id matches, but vidloom decoded more talker ids, "
                                       "from talker step 2 token id on")
