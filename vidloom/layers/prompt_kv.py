"""Prompt keys and values prepared once per request: what every step's cross-attention reads from a static prompt.

A DiT whose blocks cross-attend to the prompt's embeddings projects the same prompt to the same keys and values at
every step and for every CFG branch (512 tokens x D x 2D per block per step on Wan 1.3B). A network that declares
`prepare_prompt(text_embeds) -> PromptKV` (core.denoiser.PreparesPrompt) lets its loop do that once per request
and branch (diffusion.prompt_kv.PreparedPrompts) and pass the result where the embeddings went: the guidance
policies, cross-request batching and CUDA graphs take it as they take a tensor (it stacks, and its tensors are a
captured step's static inputs), and the network's `embed` reads it instead of projecting.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Hashable, Sequence

import torch
from torch import Tensor

from vidloom.layers.sharded import each_resident


@dataclass(frozen=True)
class PromptKV:
    """Every cross-attention block's keys and values of one prompt batch, [B, L, H, Dh] each, in block order.

    Rows follow the embeddings' rows; `stack` joins batches along rows (CFG's [cond; uncond], stacked requests).
    """

    keys: tuple[Tensor, ...]
    values: tuple[Tensor, ...]

    @property
    def batch(self) -> int:
        return self.keys[0].shape[0]

    @property
    def dtype(self) -> torch.dtype:
        return self.keys[0].dtype

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))

    @property
    def stacked_bytes(self) -> int:
        """What its rows add to a stacked copy (runtime.batching.stacked_bytes): all of it, `stack` concatenates."""
        return self.nbytes

    def block(self, index: int) -> tuple[Tensor, Tensor]:
        """Block `index`'s (keys, values)."""
        return self.keys[index], self.values[index]

    def rows(self, pick: slice) -> PromptKV:
        """These rows of every block's keys and values (views)."""
        return PromptKV(tuple(k[pick] for k in self.keys), tuple(v[pick] for v in self.values))

    def repeat(self, times: int) -> PromptKV:
        """Every row `times` over, in order ([r1, r2, r1, r2]): one request's rows for each CFG branch's."""
        if times == 1:
            return self
        return PromptKV(tuple(k.repeat(times, 1, 1, 1) for k in self.keys),
                        tuple(v.repeat(times, 1, 1, 1) for v in self.values))

    def batch_key(self) -> Hashable:
        """runtime.batching: batches of equal keys stack (same blocks, token count, heads, dtype, device)."""
        k = self.keys[0]
        return (len(self.keys), tuple(k.shape[1:]), k.dtype, k.device)

    @staticmethod
    def stack(batches: Sequence[PromptKV]) -> PromptKV:
        """One batch of every batch's rows, in order (BatchedCFG, runtime.batching), laid out in memory as the
        first batch's."""
        return PromptKV(tuple(cat_rows(ks) for ks in zip(*(b.keys for b in batches))),
                        tuple(cat_rows(vs) for vs in zip(*(b.values for b in batches))))

    def __repr__(self) -> str:
        # Shapes only: the lockstep record (runtime.parallel.rank) compares plan inputs by repr, and the ranks of a
        # --cfg-parallel pair hold different branches.
        return f"PromptKV(blocks={len(self.keys)}, shape={tuple(self.keys[0].shape)}, dtype={self.keys[0].dtype})"


def cat_rows(tensors: Sequence[Tensor]) -> Tensor:
    """torch.cat along rows (dim 0) keeping the first tensor's memory layout where rows are outermost: LTX-2 lays its
    [B, L, H, D] K/V out [B, H, L, D] in memory for SDPA (models.ltx2.layers.Attention.context_kv), which a plain
    cat would return [B, L, H, D]-contiguous."""
    first = tensors[0]
    order = sorted(range(first.ndim), key=lambda d: -first.stride(d))  # dims outermost first in memory
    if first.is_contiguous() or order[0] != 0:
        return torch.cat(list(tensors))
    inverse = sorted(range(first.ndim), key=order.__getitem__)
    return torch.cat([t.permute(order) for t in tensors]).permute(inverse)


def prepare_prompt_kv(attentions: Sequence[Any], embed: Callable[[Tensor], Tensor], embeds: Tensor,
                      kv: Callable[[Any, Tensor], tuple[Tensor, Tensor]] | None = None) -> PromptKV:
    """Every cross-attention's `context_kv` (nn.Modules projecting their context apart from their queries, as
    models.wan.transformer.WanAttention), or `kv(attention, tokens)` (another context of theirs: Wan I2V's image
    tokens), of the prompt `embed(embeds)` (the DiT's text projection), in block order. Under --shard-weights each
    block's whole weights are gathered for its projection and freed after (layers.sharded.resident)."""
    tokens = embed(embeds)
    pairs = each_resident(attentions, lambda attention: attention.context_kv(tokens) if kv is None
                          else kv(attention, tokens))
    return PromptKV(tuple(k for k, _ in pairs), tuple(v for _, v in pairs))


def prompt_kv_bytes(blocks: int, tokens: int, dim: int, element_size: int) -> int:
    """Bytes of one prompt row's prepared keys and values: `blocks` cross-attentions of `dim` wide K and V."""
    return blocks * 2 * tokens * dim * element_size
