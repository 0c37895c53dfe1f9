"""Qwen-Image's true CFG: the classic combination, rescaled per token to the conditional prediction's norm
(QwenImagePipeline: comb * |cond| / |comb| over the channel axis)."""

from __future__ import annotations

import torch
from torch import Tensor

from vidloom.diffusion.guidance import GuidanceScale, Network, TwoBranchCFG, cfg_combine


class NormRescaledCFG:
    """A guidance policy over another one's branches (sequential or parallel): how the branches run is its,
    the combination is Qwen-Image's. No negative embeddings: one conditional forward, no rescale."""

    def __init__(self, branches: TwoBranchCFG) -> None:
        self.inner = branches

    def __call__(self, network: Network, latents: Tensor, timestep: Tensor, prompt_embeds: Tensor,
                 negative_embeds: Tensor | None, guidance_scale: GuidanceScale) -> Tensor:
        if negative_embeds is None:
            return self.inner.unguided(network, latents, timestep, prompt_embeds)
        cond, uncond = self.inner.branches(network, latents, timestep, prompt_embeds, negative_embeds)
        combined = cfg_combine(cond, uncond, guidance_scale)
        return combined * (torch.norm(cond, dim=-1, keepdim=True) / torch.norm(combined, dim=-1, keepdim=True))
