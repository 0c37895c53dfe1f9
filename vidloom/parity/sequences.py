"""Parity of an autoregressive model: the ids each decode loop chose, position by position, then the signal."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import torch

from vidloom.loading.diffusers_dir import read_json
from vidloom.parity.align import ParityReport, Tolerance, align
from vidloom.parity.family import SequenceParity
from vidloom.parity.taps import TapFilter, TapRecorder


def sequence_family_for(checkpoint: Path) -> SequenceParity | None:
    """The map for a transformers folder (config.json `architectures`, no model_index.json); None otherwise."""
    from vidloom.parity.families import SEQUENCE_FAMILIES

    config = checkpoint / "config.json"
    if (checkpoint / "model_index.json").is_file() or not config.is_file():
        return None
    names = read_json(config).get("architectures") or ()
    return next((SEQUENCE_FAMILIES[name] for name in names if name in SEQUENCE_FAMILIES), None)


@dataclass
class SequenceReference:
    """A loaded reference model (transformers), reusable across comparisons."""

    model: Any
    family: SequenceParity

    @classmethod
    def load(cls, checkpoint: Path, device: str | torch.device, family: SequenceParity) -> SequenceReference:
        import transformers

        model_class = getattr(transformers, family.architecture)
        model = model_class.from_pretrained(str(checkpoint), dtype=torch.float32).to(device).eval()
        return cls(model, family)

    def run(self, request: Any, recorder: TapRecorder) -> Any:
        outputs = self.family.run_reference(self.model, request)
        record_outputs(self.family, outputs, recorder)
        return outputs[self.family.output]


def record_outputs(family: SequenceParity, outputs: Mapping[str, Any], recorder: TapRecorder) -> None:
    """Each id sequence as one `token` tap per position (loop = its name), then the signal as a stage tap."""
    for name in family.sequences:
        for position, value in enumerate(outputs[name]):
            recorder.begin_step(name, position)
            recorder.record("token", "id", torch.tensor([int(value)]))
            recorder.end_step()
    recorder.record("stage", family.output, outputs[family.output])


def compare_sequences(
    family: SequenceParity, generator: Any, reference: SequenceReference, request: Any,
    tolerance: Tolerance | None, taps: TapFilter,
) -> tuple[ParityReport, Any, Any]:
    """Both sides on `request`; the report, our signal and the reference's."""
    ours_rec, theirs_rec = TapRecorder(taps), TapRecorder(taps)
    ours = family.run_ours(generator, request)
    record_outputs(family, ours, ours_rec)
    theirs = reference.run(request, theirs_rec)
    return align(ours_rec, theirs_rec, tolerance), ours[family.output], theirs
