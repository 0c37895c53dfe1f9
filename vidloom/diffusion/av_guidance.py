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


class AudioVideoGuidance:
    """The body of one guided LTX-2 step: velocities in, guided velocities out (both streams)."""

    def __call__(
        self, network: AudioVideoNetwork, video: Tensor, audio: Tensor, timestep: Tensor, audio_timestep: Tensor,
        sigma: Tensor, prompt: TextBatch, negative: TextBatch | None, scales: AudioVideoScales,
    ) -> tuple[Tensor, Tensor]:
        """`video`/`audio` are the float32 samples; `sigma` the step's float32 sigma, 0-dim or one per sample
        ([B, 1, 1]: requests at different steps batched together)."""
        def x0(sample: Tensor, velocity: Tensor) -> Tensor:
            return sample - velocity.float() * sigma

        if scales.cfg and negative is not None:
            two = lambda t: torch.cat([t, t])  # noqa: E731
            v, a = network(two(video), two(audio), negative.cat(prompt), two(timestep), two(audio_timestep))
            (uv, cv), (ua, ca) = v.float().chunk(2), a.float().chunk(2)
            cond_v, cond_a = x0(video, cv), x0(audio, ca)
            terms_v = [(scales.video_cfg - 1) * (cond_v - x0(video, uv))]
            terms_a = [(scales.audio_cfg - 1) * (cond_a - x0(audio, ua))]
        else:
            cv, ca = network(video, audio, prompt, timestep, audio_timestep)
            cond_v, cond_a = x0(video, cv), x0(audio, ca)
            terms_v, terms_a = [], []
        for on, weights, kwargs in (
            (scales.stg, (scales.video_stg, scales.audio_stg), {"skip": frozenset(scales.stg_blocks)}),
            (scales.modality, (scales.video_modality - 1, scales.audio_modality - 1), {"isolate": True}),
        ):
            if on:
                pv, pa = network(video, audio, prompt, timestep, audio_timestep, **kwargs)
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
