"""The network one AnyFlow-FAR rollout step runs, as the runtime's denoiser contract sees it."""

from __future__ import annotations

from typing import Any, Hashable, Sequence

from torch import Tensor

from vidloom.families.wan_causal.kv_cache import FarKVCache, FarKVStack
from vidloom.families.wan_causal.layout import ChunkLayout
from vidloom.families.wan_causal.parallel import WHOLE_CHUNKS
from vidloom.families.wan_causal.text import FarText
from vidloom.families.wan_causal.transformer import FarConditioning, FarTransformer


class FarNetwork:
    """The network one rollout step runs: (latents, t, r, text) -> the chunk's mean velocity.

    Built per step (it binds the chunk's layout and the request's KV slab, or none to recompute), so
    nothing per request lands on the shared transformer. Its cache scope is the chunk: a step cache
    never reuses one chunk's residual for the next chunk's tokens.

    Steps of several requests at the same chunk position stack into one forward (batch_key / stack): the same
    layout (chunk sizes so far, latent grid) and slabs holding the same context, each request's K/V written to and
    read from its own slab (FarKVStack).
    """

    def __init__(self, transformer: FarTransformer, layout: ChunkLayout, cache: FarKVCache | FarKVStack | None,
                 chunk: int) -> None:
        self.transformer, self.layout, self.cache = transformer, layout, cache
        self.cache_scope = chunk

    def batch_key(self) -> tuple[Any, ...] | None:
        """None under sequence parallel (a rank holds its rows of every chunk; its steps run alone)."""
        if self.transformer.sequence is not WHOLE_CHUNKS:
            return None
        slab = None
        if isinstance(self.cache, FarKVCache):
            keys = self.cache.keys
            slab = (self.cache.context_tokens, self.cache.context_rows, keys.shape[1], keys.shape[3:], keys.dtype,
                    keys.device)
        elif self.cache is not None:
            return None  # already a stack
        return (id(self.transformer), self.layout, self.cache_scope, slab)

    def graph_split(self) -> tuple[Hashable, tuple[Any, ...]]:
        """core.denoiser.GraphInputs: a captured step bakes in the transformer, the chunk's layout and the KV slab
        it writes into and reads from, with the context length it holds (the attention reads that prefix: a
        graph per chunk position); it reads no other tensor of this view. The slab is kept by identity, never
        copied into a static input: under cuda_graphs it is a static buffer (runtime.static_buffers), the same
        tensors for every request of its shape, so each replay writes the chunk's K/V into the slab the request's
        prefill filled."""
        cache = self.cache
        context = (cache.context_tokens, cache.context_rows) if cache is not None else None
        return (self.transformer, self.layout, self.cache_scope, cache, context), ()

    def graph_rebuild(self, parts: tuple[Any, ...]) -> FarNetwork:
        return self

    @staticmethod
    def stack(views: Sequence[FarNetwork]) -> FarNetwork:
        first = views[0]
        caches = [v.cache for v in views]
        stacked = None if first.cache is None else FarKVStack(caches)  # type: ignore[arg-type]
        return FarNetwork(first.transformer, first.layout, stacked, first.cache_scope)

    def __call__(self, latents: Tensor, t: Tensor, r: Tensor, text: FarText) -> Tensor:
        x, cond = self.embed(latents, t, r, text)
        return self.head(self.run_blocks(x, cond), cond)

    # The staged denoiser contract (core.denoiser.StagedDenoiser); __call__ is their composition.

    @property
    def num_blocks(self) -> int:
        return self.transformer.num_blocks

    def embed(self, latents: Tensor, t: Tensor, r: Tensor, text: FarText) -> tuple[Tensor, FarConditioning]:
        if self.cache is None:
            return self.transformer.embed_recompute(latents, t, r, text, self.layout)
        return self.transformer.embed_step(latents, t, r, text, self.layout, self.cache)

    def run_blocks(self, x: Tensor, cond: FarConditioning, start: int = 0, end: int | None = None) -> Tensor:
        return self.transformer.run_blocks(x, cond, start, end)

    def block_input(self, x: Tensor, cond: FarConditioning, index: int = 0) -> Tensor:
        return self.transformer.block_input(x, cond, index)

    def head(self, x: Tensor, cond: FarConditioning) -> Tensor:
        return self.transformer.head(x, cond)
