"""A parity map's shape: how one reference pipeline lines up with our program (FamilyParity)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np
import torch

from vidloom.core.errors import InvalidRequest
from vidloom.core.request import GenerationRequest
from vidloom.parity.align import Tolerance
from vidloom.parity.taps import BlockList

ReferenceCall = Callable[[Any, Mapping[str, Any], GenerationRequest, dict[str, Any]],
                         "np.ndarray | Mapping[str, np.ndarray]"]
"""(pipeline, its original scheduler config, resolved request, step-callback kwargs) -> frames in our layout,
or our stage tap names -> outputs (the frames under FamilyParity.output, say a waveform beside them)."""


@dataclass(frozen=True)
class FamilyParity:
    """How one reference pipeline lines up with our program."""

    pipeline: str  # the diffusers class name
    our_inputs: Mapping[str, str]
    """Our denoiser's forward arguments that are compared -> tap names."""
    their_inputs: Mapping[str, str]
    """The reference denoiser's forward arguments -> the same tap names."""
    blocks: Mapping[str, tuple[BlockList, BlockList]]
    """Tap prefix -> (our block list, the reference's block list)."""
    call: ReferenceCall
    output: str = "decode.video"
    """Our stage tap holding the final frames; the reference's output is recorded under it."""
    denoisers: tuple[str, ...] = ("transformer",)
    """Our components, and the pipeline's attributes, holding the denoiser; each present one is tapped the
    same way (a two-expert mixture's experts run different steps, so their taps never share a key)."""
    reference_denoisers: tuple[str, ...] | None = None
    """The pipeline's attributes holding the denoiser when they differ from our component names."""
    load_kwargs: Mapping[str, Any] = field(default_factory=dict)
    """Extra keyword arguments of the pipeline's from_pretrained."""
    loop: str = "denoise"
    """Our loop the reference's denoise steps line up with; steps of our other loops are not tapped."""
    stages: tuple[str, ...] = ()
    """A reference that chains pipeline calls (LTX-2 two-stage): our loops its successive calls line up with.
    Its `call` then finds `next_stage` in the callback kwargs, takes it out, and calls it before each call
    after the first (steps count from 0 again under the next loop). Empty: one call, lined up with `loop`."""
    deploy: Mapping[str, Any] = field(default_factory=dict)
    """DeployConfig fields our side loads with when run_parity loads it (two_stage for the chain)."""
    state_latents: str | Callable[[Any], Any] = "latents"
    """Our loop state's attribute holding the latents the reference's callback reports as `latents` (or a
    function of the state giving them)."""
    step_call: Callable[[Mapping[str, Any]], bool] | None = None
    """Whether a reference denoiser call (its keyword arguments) belongs to a step (None: every call does); the
    others (a KV-cache fill between steps, which our runtime runs as a loop of its own) are not tapped."""
    their_latents: Callable[[torch.Tensor], torch.Tensor] | None = None
    """The reference's callback latents -> our layout (None: the same layout)."""
    their_rows: tuple[int, ...] = ()
    """The reference batches the CFG branches in one call where we run them as separate calls: its batch row
    rows[i] is our call i (Stable Audio's [uncond, cond] against our cond-then-uncond: (1, 0)); empty: a
    reference call is one of ours."""
    their_skipped: Callable[[torch.nn.Module, Mapping[str, Any]], bool] | None = None
    """(reference denoiser, a call's keyword arguments) -> True for a call our side does not make because it cannot
    change the result (LTX-2's STG pass where no named block is perturbed): not tapped, not counted as a call."""
    tolerance: Tolerance | None = None
    """The family's stated tolerance, used when the caller gives none (None: Tolerance's defaults)."""
    untapped: frozenset[str] = frozenset()
    """Tap kinds one side cannot record here; recorded on neither (the map says why)."""
    refused: tuple[str, ...] = field(default=())
    """Request fields and options the reference cannot take: a request setting them is refused by name."""

    def check(self, request: GenerationRequest) -> None:
        for name in self.refused:
            value = getattr(request, name) if hasattr(request, name) else request.option(name)
            if value is not None and value not in ("", (), False):  # False: a flag left off
                raise InvalidRequest(name, f"the reference pipeline {self.pipeline} cannot take it; leave it unset")


def generator_for(request: GenerationRequest) -> torch.Generator:
    # Our noise comes from a CPU generator seeded the same way (diffusion.noise.initial_noise).
    return torch.Generator("cpu").manual_seed(int(request.seed))  # type: ignore[arg-type]


@dataclass(frozen=True)
class SequenceParity:
    """How an autoregressive model lines up with its reference (a transformers model, not a pipeline).

    Its decode loops choose ids (tokens, codec codes) rather than step latents, so there are no per-step
    tensors to tap: each id sequence is recorded one `token` tap per position (loop = the sequence's name,
    step = the position) and compared exactly, so the report names the first position where a loop chose
    differently; the signal decoded from them (a waveform) is a stage tap compared within tolerance.
    """

    architecture: str
    """The transformers class a checkpoint's config.json names (its `architectures`); also the reference."""
    build_request: Callable[[str, int, int], Any]
    """(prompt, seed, max reply tokens) -> the request both sides run (the CLI's)."""
    run_ours: Callable[[Any, Any], Mapping[str, Any]]
    """(our VideoGenerator, request) -> outputs by name: id sequences and signals."""
    run_reference: Callable[[Any, Any], Mapping[str, Any]]
    """(the loaded reference model, request) -> the same names."""
    sequences: tuple[str, ...]
    """The outputs that are id sequences, in decode order."""
    output: str
    """The final signal (compared as stage tap `output`)."""
    describe: Callable[[Any], str] = repr
    """A request -> one line for the CLI's report header."""


@dataclass(frozen=True)
class ParityMaps:
    """One family's parity maps, as its declaration names them (Family.parity); vidloom.parity.families merges
    every family's into the lookup tables."""

    pipelines: tuple[FamilyParity, ...] = ()
    """A map per diffusers pipeline class the family is compared against (keyed by FamilyParity.pipeline)."""
    video_to_video: Mapping[str, str] = field(default_factory=dict)
    """A folder's pipeline -> the one diffusers runs video-to-video with on the same folder."""
    image_to_video: Mapping[str, str] = field(default_factory=dict)
    """A folder's pipeline -> the one diffusers runs image-to-video with on the same folder's components."""
    two_stage: Mapping[str, FamilyParity] = field(default_factory=dict)
    """A folder's pipeline -> the map of its two-stage chain (our DeployConfig two_stage)."""
    sequences: tuple[SequenceParity, ...] = ()
    """Autoregressive maps, keyed by the transformers architecture (SequenceParity.architecture)."""
