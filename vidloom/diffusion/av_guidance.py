"""Guidance for joint audio-video denoisers (LTX-2): per-stream CFG, spatio-temporal and modality guidance.

LTX-2 combines up to three guidance terms in x0 (denoised) space, each with its own scale per
stream, then rescales the guided x0 towards the conditional one's standard deviation:

    x0 = x0_cond + (cfg - 1)(x0_cond - x0_uncond) + stg (x0_cond - x0_perturbed)
                 + (modality - 1)(x0_cond - x0_isolated)

where x0_perturbed skips self-attention in some blocks (STG) and x0_isolated turns the audio<->video
attention off. The formula and its evaluation order follow diffusers' LTX2Pipeline denoising loop (parity
needs the same rounding); the policy shape follows vidloom.diffusion.guidance. Like those policies it holds
no per-request state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor


class TextBatch(Protocol):
    """Encoded prompts a network reads; `cat` stacks two batches (negative first, as the reference does)."""

    def cat(self, other: Any) -> Any: ...


class AudioVideoNetwork(Protocol):
    """(video [B, N, C], audio [B, Na, Ca], text, timesteps) -> velocities of both, like the inputs.

    `timestep` may be per token ([B, N]); `audio_timestep` [B] is the step's scalar timestep (LTX-2.3 also
    conditions text and cross-modal attention on it). The network repeats its positions to the batch given.
    `isolate`: no audio<->video attention; `skip`: blocks whose self-attention is perturbed.
    """

    def __call__(
        self, video: Tensor, audio: Tensor, text: Any, timestep: Tensor, audio_timestep: Tensor, *, isolate: bool = False, skip: frozenset[int] = frozenset(),
    ) -> tuple[Tensor, Tensor]: ...


@dataclass(frozen=True)
class AudioVideoScales:
    """Guidance of one request, per stream (defaults: LTX2Pipeline.__call__'s)."""

    video_cfg: float = 3.0
    audio_cfg: float = 7.0
    video_stg: float = 1.0
    audio_stg: float = 1.0
    video_modality: float = 3.0
    audio_modality: float = 3.0
    video_rescale: float = 0.7
    audio_rescale: float = 0.7
    stg_blocks: tuple[int, ...] = (28,)  # diffusers' default block for LTX-2.3 (29 for LTX-2.0)

    @property
    def cfg(self) -> bool:
        return self.video_cfg > 1.0 or self.audio_cfg > 1.0

    @property
    def stg(self) -> bool:
        return self.video_stg > 0.0 or self.audio_stg > 0.0

    @property
    def modality(self) -> bool:
        return self.video_modality > 1.0 or self.audio_modality > 1.0


def rescale(guided: Tensor, cond: Tensor, factor: float) -> Tensor:
    """Pull `guided` towards `cond`'s per-sample std (Lin et al. 2023, arXiv:2305.08891 section 3.4)."""
    dims = list(range(1, cond.ndim))
    rescaled = guided * (cond.std(dim=dims, keepdim=True) / guided.std(dim=dims, keepdim=True))
    return factor * rescaled + (1 - factor) * guided


Predictions = dict[str, tuple[Tensor, Tensor]]
"""Each pass's (video, audio) velocity, by pass name (PASSES)."""

PASSES = ("cond", "uncond", "stg", "modality")
"""The network passes a guided step may run: the prompt, the negative prompt (CFG), the prompt with perturbed
self-attention (STG) and the prompt with the modalities isolated."""


def guidance_passes(scales: AudioVideoScales, negative: TextBatch | None) -> tuple[str, ...]:
    """The passes a step guided by `scales` runs, in PASSES order (the conditional one always, first)."""
    on = {"cond": True, "uncond": scales.cfg and negative is not None, "stg": scales.stg, "modality": scales.modality}
    return tuple(name for name in PASSES if on[name])


class AudioVideoGuidance:
    """The body of one guided LTX-2 step: velocities in, guided velocities out (both streams). One device runs
    every pass, the CFG pair as one batch of two as the reference does; `predictions` is what a subclass spreads."""

    def __call__(
        self, network: AudioVideoNetwork, video: Tensor, audio: Tensor, timestep: Tensor, audio_timestep: Tensor,
        sigma: Tensor, prompt: TextBatch, negative: TextBatch | None, scales: AudioVideoScales,
    ) -> tuple[Tensor, Tensor]:
        """`video`/`audio` are the float32 samples; `sigma` the step's float32 sigma, 0-dim or one per sample
        ([B, 1, 1]: requests at different steps batched together)."""
        passes = guidance_passes(scales, negative)
        preds = self.predictions(network, passes, video, audio, timestep, audio_timestep, prompt, negative, scales)
        return combine(preds, video, audio, sigma, scales)

    def predictions(
        self, network: AudioVideoNetwork, passes: tuple[str, ...], video: Tensor, audio: Tensor, timestep: Tensor,
        audio_timestep: Tensor, prompt: TextBatch, negative: TextBatch | None, scales: AudioVideoScales,
    ) -> Predictions:
        preds: Predictions = {}
        if "uncond" in passes:
            two = lambda t: torch.cat([t, t])  # noqa: E731
            v, a = network(two(video), two(audio), negative.cat(prompt), two(timestep), two(audio_timestep))
            (uv, cv), (ua, ca) = v.float().chunk(2), a.float().chunk(2)
            preds.update(cond=(cv, ca), uncond=(uv, ua))
        for name in passes:
            if name not in preds:
                preds[name] = run_pass(network, name, video, audio, timestep, audio_timestep, prompt, negative, scales)
        return preds


def run_pass(
    network: AudioVideoNetwork, name: str, video: Tensor, audio: Tensor, timestep: Tensor, audio_timestep: Tensor,
    prompt: TextBatch, negative: TextBatch | None, scales: AudioVideoScales,
) -> tuple[Tensor, Tensor]:
    """One pass of PASSES, a forward of the samples' batch."""
    kwargs = {"stg": {"skip": frozenset(scales.stg_blocks)}, "modality": {"isolate": True}}.get(name, {})
    text = negative if name == "uncond" else prompt
    return network(video, audio, text, timestep, audio_timestep, **kwargs)


def combine(preds: Predictions, video: Tensor, audio: Tensor, sigma: Tensor,
            scales: AudioVideoScales) -> tuple[Tensor, Tensor]:
    """The guided velocities of both streams from every pass's prediction (the formula at the top)."""
    def x0(sample: Tensor, velocity: Tensor) -> Tensor:
        return sample - velocity.float() * sigma

    cv, ca = preds["cond"]
    cond_v, cond_a = x0(video, cv), x0(audio, ca)
    terms_v, terms_a = [], []
    for name, weights in (("uncond", (scales.video_cfg - 1, scales.audio_cfg - 1)),
                          ("stg", (scales.video_stg, scales.audio_stg)),
                          ("modality", (scales.video_modality - 1, scales.audio_modality - 1))):
        if name in preds:
            pv, pa = preds[name]
            terms_v.append(weights[0] * (cond_v - x0(video, pv)))
            terms_a.append(weights[1] * (cond_a - x0(audio, pa)))
    out = []
    for sample, cond, terms, factor in ((video, cond_v, terms_v, scales.video_rescale),
                                        (audio, cond_a, terms_a, scales.audio_rescale)):
        guided = cond
        for term in terms:
            guided = guided + term
        if factor > 0:
            guided = rescale(guided, cond, factor)
        out.append((sample - guided) / sigma)
    return out[0], out[1]


class PassGroup(Protocol):
    """The ranks a guided step's passes are spread over (vidloom.runtime.parallel's CFG group)."""

    rank: int
    size: int

    def all_gather(self, x: Tensor) -> Tensor:
        """[size, *x.shape]: every rank's x, in rank order, identical on every rank."""
        ...


class SplitAudioVideoGuidance(AudioVideoGuidance):
    """The step's passes spread over a group of ranks (--cfg-parallel): pass j runs on rank j mod size, as one
    forward of the samples' batch, and every rank gathers every prediction and combines them with the same formula,
    so all ranks step on identical values. cond and uncond land on ranks 0 and 1; STG and the isolated pass, when
    on, follow round the group. A step with one pass (no guidance, as stage 2 may be) runs it on every rank."""

    def __init__(self, group: PassGroup) -> None:
        self.group = group

    def predictions(
        self, network: AudioVideoNetwork, passes: tuple[str, ...], video: Tensor, audio: Tensor, timestep: Tensor,
        audio_timestep: Tensor, prompt: TextBatch, negative: TextBatch | None, scales: AudioVideoScales,
    ) -> Predictions:
        size, rank = self.group.size, self.group.rank
        if len(passes) == 1:
            return {passes[0]: run_pass(network, passes[0], video, audio, timestep, audio_timestep, prompt, negative,
                                        scales)}
        per_rank = -(-len(passes) // size)
        # float32, as the combine reads them; a rank with fewer passes than the others sends zeros in their place.
        rows = [torch.cat([p.float().flatten() for p in run_pass(network, name, video, audio, timestep,
                                                                  audio_timestep, prompt, negative, scales)])
                for name in passes[rank::size]]
        rows += [video.new_zeros(video.numel() + audio.numel(), dtype=torch.float32)] * (per_rank - len(rows))
        gathered = self.group.all_gather(torch.stack(rows))  # [size, per_rank, video + audio values]
        preds: Predictions = {}
        for j, name in enumerate(passes):
            v, a = gathered[j % size, j // size].split((video.numel(), audio.numel()))
            preds[name] = (v.view(video.shape), a.view(audio.shape))
        return preds
