"""`run_parity`: one request through vidloom and through the reference pipeline, taps aligned."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from vidloom import registry
from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import InvalidRequest
from vidloom.core.request import GenerationRequest
from vidloom.parity.align import ParityReport, Tolerance, align
from vidloom.parity.family import FamilyParity
from vidloom.parity.reference import Reference, family_for, require_diffusers
from vidloom.parity.sequences import SequenceReference, compare_sequences, sequence_family_for
from vidloom.parity.taps import ModuleTaps, RuntimeTaps, TapFilter, TapRecorder
from vidloom.runtime.engine import Engine


@dataclass
class ParityRun:
    """A comparison's report, both sides' final frames, the request both ran (resolved: seed, defaults)
    and the reference pipeline (pass it back as `reference=` to compare again without reloading)."""

    report: ParityReport
    ours: Any
    theirs: Any
    request: Any  # a GenerationRequest; an autoregressive model's own request (SpeechRequest)
    reference: Reference | SequenceReference


def checkpoint_dir(model: str | Path) -> Path:
    """The diffusers folder behind `model` (a folder, or a registered id such as the demo)."""
    card = registry.resolve_card(model)
    return registry.resolve_checkpoint(card)


def run_parity(
    model: str | Path,
    request: Any,
    *,
    tolerance: Tolerance | None = None,
    taps: TapFilter | None = None,
    device: str = "cpu",
    generator: Any | None = None,
    reference: Reference | SequenceReference | None = None,
    two_stage: bool = False,
) -> ParityRun:
    """Run `request` through vidloom and through `model`'s own diffusers pipeline (both float32 on
    `device`) with named taps, and align them: `report.first_divergence` names the first layer that
    differs beyond `tolerance`.

    `generator` (a VideoGenerator) and `reference` (a Reference) reuse models loaded by the caller
    (tests do); otherwise both load from `model`'s folder. Raises ReferenceUnavailable without
    diffusers or for a pipeline with no parity map (vidloom.parity.families.FAMILIES).

    A transformers autoregressive folder (vidloom.parity.families.SEQUENCE_FAMILIES: Qwen2.5-Omni) takes its
    own request (a SpeechRequest) and compares the ids its loops chose and the decoded signal instead.

    `two_stage` (implied by a given generator deployed with two_stage) compares the multi-stage chain (LTX-2:
    generate, upsample, refine) against the reference's chained pipeline calls.
    """
    if generator is not None:
        instance = getattr(getattr(generator, "engine", None), "instance", None)
        two_stage = two_stage or bool(getattr(getattr(instance, "deploy", None), "two_stage", False))
    checkpoint = checkpoint_dir(model)
    sequence = sequence_family_for(checkpoint) if reference is None else (
        reference.family if isinstance(reference, SequenceReference) else None)
    if sequence is None:
        require_diffusers()
    if generator is None:
        from vidloom.generator import VideoGenerator

        deploy = {} if sequence is not None else _family(checkpoint, request, reference, two_stage).deploy
        generator = VideoGenerator.from_pretrained(checkpoint, device=device, dtype=torch.float32,
                                                   **({"deploy": DeployConfig(**deploy)} if deploy else {}))
    if sequence is not None:
        keep = _without(taps or TapFilter(), frozenset({"input", "block", "output", "latents"}))
        reference = reference or SequenceReference.load(checkpoint, device, sequence)
        assert isinstance(reference, SequenceReference)
        report, ours, theirs = compare_sequences(sequence, generator, reference, request, tolerance, keep)
        return ParityRun(report, ours, theirs, request, reference)
    assert not isinstance(reference, SequenceReference)
    family = _family(checkpoint, request, reference, two_stage)
    family.check(request)
    taps = _without(taps or TapFilter(), family.untapped | {"token"})
    ours_rec = TapRecorder(taps)
    ours, resolved = _run_ours(generator.engine, family, request, ours_rec)
    reference = reference or Reference.load(checkpoint, device, family)
    theirs_rec = TapRecorder(taps)
    theirs = reference.run(resolved, theirs_rec)
    return ParityRun(align(ours_rec, theirs_rec, tolerance or family.tolerance), ours, theirs, resolved, reference)


def _family(checkpoint: Path, request: Any, reference: Reference | SequenceReference | None,
            two_stage: bool) -> FamilyParity:
    if isinstance(reference, Reference):
        return reference.family
    return family_for(checkpoint, request, two_stage)


def _without(keep: TapFilter, untapped: frozenset[str]) -> TapFilter:
    kinds = keep.kinds - untapped
    if not kinds:
        raise InvalidRequest("taps", f"this model cannot record {', '.join(sorted(untapped))} taps; ask for others")
    return dataclasses.replace(keep, kinds=kinds)


def _run_ours(
    engine: Any, family: FamilyParity, request: GenerationRequest, recorder: TapRecorder
) -> tuple[Any, GenerationRequest]:
    if not isinstance(engine, Engine):
        raise InvalidRequest("devices", "parity runs on one device (a plain Engine), not a multi-device pool")
    blocks = {prefix: ours for prefix, (ours, _) in family.blocks.items()}
    components = engine.instance.components
    taps = [ModuleTaps(recorder, components[name], family.our_inputs, blocks)
            for name in family.denoisers if components.get(name) is not None]
    loops = frozenset(family.stages or (family.loop,))
    run = engine.submit(request, watch=RuntimeTaps(recorder, loops, family.state_latents))
    try:
        while not run.step():
            pass
        outputs = run.outputs()
    finally:
        run.close()
        for tap in taps:
            tap.close()
    # The node that wrote the final output recorded it as stage tap family.output ("decode.audio": slot audio).
    return outputs[family.output.rpartition(".")[2]], run.request
