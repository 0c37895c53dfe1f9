"""The network one AnyFlow-FAR rollout step runs, as the runtime's denoiser contract sees it."""

from __future__ import annotations

from torch import Tensor

from vidloom.families.wan_causal.kv_cache import FarKVCache
from vidloom.families.wan_causal.layout import ChunkLayout
from vidloom.families.wan_causal.transformer import FarConditioning, FarTransformer
from vidloom.layers.prompt_kv import PromptKV


class FarNetwork:
    """The network one rollout step runs: (latents, t, r, text) -> the chunk's mean velocity.

    Built per step (it binds the chunk's layout and the request's KV slab, or none to recompute), so
    nothing per request lands on the shared transformer. Its cache scope is the chunk: a step cache
    never reuses one chunk's residual for the next chunk's tokens.
    """

    def __init__(self, transformer: FarTransformer, layout: ChunkLayout, cache: FarKVCache | None,
                 chunk: int) -> None:
        self.transformer, self.layout, self.cache = transformer, layout, cache
        self.cache_scope = chunk

    def __call__(self, latents: Tensor, t: Tensor, r: Tensor, text: PromptKV) -> Tensor:
        x, cond = self.embed(latents, t, r, text)
        return self.head(self.run_blocks(x, cond), cond)

    # The staged denoiser contract (core.denoiser.StagedDenoiser); __call__ is their composition.

    @property
    def num_blocks(self) -> int:
        return self.transformer.num_blocks

    def embed(self, latents: Tensor, t: Tensor, r: Tensor, text: PromptKV) -> tuple[Tensor, FarConditioning]:
        if self.cache is None:
            return self.transformer.embed_recompute(latents, t, r, text, self.layout)
        return self.transformer.embed_step(latents, t, r, text, self.layout, self.cache)

    def run_blocks(self, x: Tensor, cond: FarConditioning, start: int = 0, end: int | None = None) -> Tensor:
        return self.transformer.run_blocks(x, cond, start, end)

    def block_input(self, x: Tensor, cond: FarConditioning, index: int = 0) -> Tensor:
        return self.transformer.block_input(x, cond, index)

    def head(self, x: Tensor, cond: FarConditioning) -> Tensor:
        return self.transformer.head(x, cond)
