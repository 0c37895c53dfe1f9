"""Parity as tooling: named taps on vidloom and on the reference pipeline, aligned to the first divergence.

    from vidloom.parity import run_parity
    result = run_parity("path/to/diffusers-folder", GenerationRequest(prompt="a fox", seed=0))
    print(result.report.format())

`vidloom parity --model DIR` is the same from the shell.
"""

from vidloom.parity.align import ParityReport, TapDiff, Tolerance, align
from vidloom.parity.reference import Reference, ReferenceUnavailable
from vidloom.parity.run import ParityRun, run_parity
from vidloom.parity.taps import TAP_KINDS, TapFilter, TapKey, TapRecorder

__all__ = [
    "TAP_KINDS", "ParityReport", "ParityRun", "Reference", "ReferenceUnavailable", "TapDiff", "TapFilter", "TapKey",
    "TapRecorder", "Tolerance", "align", "run_parity",
]
