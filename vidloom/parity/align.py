"""The aligner: walk our taps in execution order against the reference's and find the first divergence."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from torch import Tensor

from vidloom.parity.taps import TapKey, TapRecorder


@dataclass(frozen=True)
class Tolerance:
    """A tap diverges when max|ours - theirs| > atol + rtol * max|theirs|.

    The defaults suit float32 on both sides: matching runs differ by ~1e-6 (op order, batched
    text encoding), while a wrong op moves a tap by > 1e-3 of its scale.
    """

    atol: float = 1e-4
    rtol: float = 1e-4

    def __post_init__(self) -> None:
        if self.atol < 0 or self.rtol < 0:
            raise ValueError(f"tolerance: atol and rtol must be >= 0, got atol={self.atol}, rtol={self.rtol}")

    def bound(self, scale: float) -> float:
        return self.atol + self.rtol * scale


@dataclass(frozen=True)
class TapDiff:
    """One tap compared: the largest absolute difference and what it was allowed."""

    key: TapKey
    max_abs: float
    scale: float  # max|theirs|
    bound: float
    shapes: tuple[tuple[int, ...], tuple[int, ...]]
    values: str = ""
    """Both sides' values, for a few exactly compared ids."""

    @property
    def relative(self) -> float:
        return self.max_abs / self.scale if self.scale > 0 else (0.0 if self.max_abs == 0 else math.inf)

    @property
    def diverged(self) -> bool:
        return self.shapes[0] != self.shapes[1] or not self.max_abs <= self.bound  # NaN diverges too

    def describe(self) -> str:
        if self.shapes[0] != self.shapes[1]:
            return f"{self.key.label()}: shape {self.shapes[0]} vs reference {self.shapes[1]}"
        if self.values:
            return f"{self.key.label()}: {self.values}"
        return (f"{self.key.label()}: max abs diff {self.max_abs:.3e} > bound {self.bound:.3e} "
                f"(relative {self.relative:.3e})")


def compare(key: TapKey, ours: Tensor, theirs: Tensor, tolerance: Tolerance) -> TapDiff:
    shapes = (tuple(ours.shape), tuple(theirs.shape))
    if shapes[0] != shapes[1]:
        return TapDiff(key, math.inf, math.nan, tolerance.bound(0.0), shapes)
    a, b = ours.double(), theirs.double()
    scale = float(b.abs().max()) if b.numel() else 0.0
    max_abs = float((a - b).abs().max()) if a.numel() else 0.0
    # Ids (tokens, codes) are compared exactly: a relative bound on an id of 10^5 would pass a wrong one.
    exact = not (ours.is_floating_point() or theirs.is_floating_point())
    values = ""
    if exact and a.numel() <= 4:
        values = f"ours {ours.flatten().tolist()}, reference {theirs.flatten().tolist()}"
    return TapDiff(key, max_abs, scale, 0.0 if exact else tolerance.bound(scale), shapes, values)


@dataclass
class ParityReport:
    """Every tap both sides recorded, compared in our execution order; the first divergence names its layer."""

    diffs: list[TapDiff]
    only_ours: list[TapKey] = field(default_factory=list)
    only_theirs: list[TapKey] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """Recording limits hit (taps dropped past the byte budget), said in the report."""

    @property
    def first_divergence(self) -> TapDiff | None:
        return next((d for d in self.diffs if d.diverged), None)

    @property
    def unmatched(self) -> list[TapKey]:
        """Step taps one side recorded and the other did not: a gap in the tap map, never passed over.
        (Stage taps are ours alone but for the final frames: the reference has no program nodes.)"""
        return [key for key in (*self.only_ours, *self.only_theirs) if key.kind != "stage"]

    @property
    def ok(self) -> bool:
        return self.first_divergence is None and not self.unmatched

    def summary(self) -> str:
        first = self.first_divergence
        if first is None and self.unmatched and self.unmatched[0].kind == "token":
            key = self.unmatched[0]
            side = "vidloom" if key in self.only_ours else "the reference"
            return (f"parity: every compared id matches, but {side} decoded more {key.loop} ids, from "
                    f"{key.label()} on (the other side stopped there)")
        if first is None and self.unmatched:
            return (f"parity: {len(self.unmatched)} step taps were recorded on one side only, from "
                    f"{self.unmatched[0].label()} on: the parity map misses them (see the lists below)")
        if first is None:
            worst = max(self.diffs, key=lambda d: d.relative, default=None)
            tail = f"; largest relative diff {worst.relative:.3e} at {worst.key.label()}" if worst else ""
            return f"parity: no divergence over {len(self.diffs)} taps{tail}"
        return f"parity: first divergence at {first.describe()}"

    def format(self, rows: int = 40) -> str:
        """The summary line, then one row per step (and one for the stages): its worst tap and status."""
        header = f"{'where':<22}{'taps':>6}  {'worst tap':<34}{'max abs':>11}{'relative':>11}  status"
        lines = [self.summary(), "", header]
        groups: dict[str, list[TapDiff]] = {}
        for diff in self.diffs:  # an autoregressive loop's ids are one row: "talker ids"
            groups.setdefault(f"{diff.key.loop} ids" if diff.key.kind == "token" else diff.key.where, []).append(diff)
        for index, (where, diffs) in enumerate(groups.items()):
            if index == rows:
                lines.append(f"... {len(groups) - rows} more steps")
                break
            bad = [d for d in diffs if d.diverged]
            worst = bad[0] if bad else max(diffs, key=lambda d: d.relative)
            name = worst.key.label()
            if worst.key.kind == "token":
                name = f"position {worst.key.step}"
            elif worst.key.step is not None:
                name = name.removeprefix(where).strip()
            status = f"DIVERGED ({len(bad)})" if bad else "ok"
            numbers = f"{worst.max_abs:>11.3e}{worst.relative:>11.3e}"
            lines.append(f"{where:<22}{len(diffs):>6}  {name:<34}{numbers}  {status}")
        for side, keys in (("vidloom", self.only_ours), ("the reference", self.only_theirs)):
            if keys:
                shown = ", ".join(k.label() for k in keys[:4]) + (", ..." if len(keys) > 4 else "")
                lines.append(f"only in {side} (not compared): {len(keys)} taps: {shown}")
        lines.extend(f"note: {note}" for note in self.notes)
        return "\n".join(lines)


def align(ours: TapRecorder, theirs: TapRecorder, tolerance: Tolerance | None = None) -> ParityReport:
    """Compare every tap both recorders hold, in `ours`' order."""
    tolerance = tolerance or Tolerance()
    diffs = [compare(key, value, theirs.taps[key], tolerance) for key, value in ours.taps.items() if key in theirs.taps]
    notes = [
        f"{side} dropped {rec.dropped} taps past the {rec.keep.max_bytes >> 20} MiB tap budget, from "
        f"{rec.first_dropped.label()} on: raise the budget or record fewer kinds/steps"
        for side, rec in (("vidloom", ours), ("the reference", theirs))
        if rec.dropped and rec.first_dropped is not None
    ]
    return ParityReport(
        diffs=diffs,
        only_ours=[k for k in ours.taps if k not in theirs.taps],
        only_theirs=[k for k in theirs.taps if k not in ours.taps],
        notes=notes,
    )
