"""Classifier-free guidance policies: how the cond and uncond branches reach the network.

Every policy combines with the same rule, `cfg_combine`; they differ only in whether the
two branches run as two forwards of batch B (sequential), one of batch 2B (batched), or
one forward of batch B on each of two ranks (parallel). Policies hold no per-request
state, so one instance serves every request.
"""

from __future__ import annotations

from typing import Callable, Protocol

import torch
from torch import Tensor

from vidloom.core.errors import DeployError

Network = Callable[[Tensor, Tensor, Tensor], Tensor]
"""(latents [B, C, F, H, W], timestep [B], text_embeds [B, L, D]) -> prediction like latents."""


GuidanceScale = float | Tensor
"""A Python float (eager), or a 0-dim float32 tensor holding it (a CUDA graph's static input)."""


def cfg_combine(cond: Tensor, uncond: Tensor, scale: GuidanceScale) -> Tensor:
    """Classic CFG (Ho & Salimans 2022, arXiv:2207.12598): uncond + scale * (cond - uncond).

    A float scale multiplies in float32 and rounds once to the activations' dtype (PyTorch
    widens Python scalars to the kernel's float32 math). A 0-dim float32 tensor would instead
    be cast to bf16 first (4.2 -> 4.1875), so the tensor form spells out the float32 product:
    eager and graph-replayed steps then compute the same bits for any scale.
    """
    diff = cond - uncond
    if isinstance(scale, Tensor):
        return uncond + (scale.float() * diff.float()).to(diff.dtype)
    return uncond + scale * diff


class GuidancePolicy(Protocol):
    """The body of one guided denoise step. Its argument names are the step plan's inputs.

    Contract for step caches: the branches reach `network` in the same order every step
    (each call, and each batch row of a call, is always the same branch).
    """

    def __call__(
        self,
        network: Network,
        latents: Tensor,
        timestep: Tensor,
        prompt_embeds: Tensor,
        negative_embeds: Tensor | None,
        guidance_scale: GuidanceScale,
    ) -> Tensor: ...


class TwoBranchCFG:
    """The step every policy shares: no negative embeddings, one conditional forward; otherwise the two
    branches' predictions (the subclass's `branches`), combined by `cfg_combine`."""

    def __call__(self, network: Network, latents: Tensor, timestep: Tensor, prompt_embeds: Tensor,
                 negative_embeds: Tensor | None, guidance_scale: GuidanceScale) -> Tensor:
        if negative_embeds is None:
            return self.unguided(network, latents, timestep, prompt_embeds)
        cond, uncond = self.branches(network, latents, timestep, prompt_embeds, negative_embeds)
        return cfg_combine(cond, uncond, guidance_scale)

    def unguided(self, network: Network, latents: Tensor, timestep: Tensor, prompt_embeds: Tensor) -> Tensor:
        return network(latents, timestep, prompt_embeds)

    def branches(self, network: Network, latents: Tensor, timestep: Tensor, prompt_embeds: Tensor,
                 negative_embeds: Tensor) -> tuple[Tensor, Tensor]:
        raise NotImplementedError


class SequentialCFG(TwoBranchCFG):
    """Cond then uncond, one forward each: the reference order (diffusers' WanPipeline)."""

    def branches(self, network: Network, latents: Tensor, timestep: Tensor, prompt_embeds: Tensor,
                 negative_embeds: Tensor) -> tuple[Tensor, Tensor]:
        return network(latents, timestep, prompt_embeds), network(latents, timestep, negative_embeds)


class BatchedCFG(TwoBranchCFG):
    """Cond and uncond stacked into one forward of twice the batch: half the kernel launches
    and weight reads per step, at the cost of twice the activation memory. Embeddings that are
    not tensors stack by their own `stack` (a text batch that pads and masks prompts of two lengths)."""

    def branches(self, network: Network, latents: Tensor, timestep: Tensor, prompt_embeds: Tensor,
                 negative_embeds: Tensor) -> tuple[Tensor, Tensor]:
        if not isinstance(prompt_embeds, Tensor):
            text = prompt_embeds.stack([prompt_embeds, negative_embeds])
        elif negative_embeds.shape[1:] != prompt_embeds.shape[1:]:
            raise ValueError(
                f"batched CFG needs equal-length embeddings, got {tuple(prompt_embeds.shape)} "
                f"and {tuple(negative_embeds.shape)}"
            )
        else:
            text = torch.cat([prompt_embeds, negative_embeds])
        both = network(torch.cat([latents, latents]), torch.cat([timestep, timestep]), text)
        cond, uncond = both.chunk(2)
        return cond, uncond


class BranchExchange(Protocol):
    """The two ranks of a CFG-parallel pair (vidloom.runtime.parallel supplies one over torch.distributed)."""

    rank: int
    """0 runs the conditional branch, 1 the unconditional one."""
    size: int
    """Ranks in the pair (2)."""

    def all_gather(self, x: Tensor) -> Tensor:
        """[size, *x.shape]: every rank's x, in rank order, identical on every rank."""
        ...


class ParallelCFG(TwoBranchCFG):
    """Cond on cfg-rank 0, uncond on cfg-rank 1, one forward of batch B each; predictions are exchanged
    and combined with the same formula on both ranks, so both samplers step on identical values. A group of
    more than two ranks (--cfg-parallel 3 or 4) is for a family whose program spreads more passes over it (LTX-2's
    SplitAudioVideoGuidance takes `pair`); classic CFG's two branches need exactly two."""

    def __init__(self, pair: BranchExchange) -> None:
        if pair.size < 2:
            raise ValueError(f"CFG-parallel needs a group of two ranks or more, got {pair.size}")
        self.pair = pair

    def unguided(self, network: Network, latents: Tensor, timestep: Tensor, prompt_embeds: Tensor) -> Tensor:
        # Requests are checked at submit (guidance_scale > 1); this guards direct callers.
        raise ValueError("CFG-parallel needs the unconditional branch: guidance_scale must be > 1")

    def branches(self, network: Network, latents: Tensor, timestep: Tensor, prompt_embeds: Tensor,
                 negative_embeds: Tensor) -> tuple[Tensor, Tensor]:
        if self.pair.size != 2:  # launch refuses a degree above the layout's cfg_passes (2 for classic CFG)
            raise ValueError(f"classic CFG has two branches, one per rank; got a group of {self.pair.size}")
        embeds = prompt_embeds if self.pair.rank == 0 else negative_embeds
        cond, uncond = self.pair.all_gather(network(latents, timestep, embeds)).unbind(0)
        return cond, uncond


CFG_MODES: dict[str, GuidancePolicy] = {
    "sequential": SequentialCFG(),
    "batched": BatchedCFG(),
}
"""DeployConfig.cfg_mode -> policy (stateless, shared). ParallelCFG is not listed: it is bound to a
rank pair, so the parallel worker builds it (DeployConfig.parallel.cfg = 2)."""


def make_guidance(mode: str) -> GuidancePolicy:
    """The policy registered as `mode`; unknown modes raise DeployError listing the known ones."""
    policy = CFG_MODES.get(mode)
    if policy is None:
        raise DeployError(f"unknown cfg_mode {mode!r}; known: {', '.join(CFG_MODES)}")
    return policy
