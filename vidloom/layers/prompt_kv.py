"""Prompt keys and values prepared once per request: what every step's cross-attention reads from a static prompt.

A DiT whose blocks cross-attend to the prompt's embeddings projects the same prompt to the same keys and values at
every step and for every CFG branch (512 tokens x D x 2D per block per step on Wan 1.3B). A network that declares
`prepare_prompt(text_embeds) -> PromptKV` (core.denoiser.PreparesPrompt) lets its loop do that once per request
and branch (diffusion.prompt_kv.PreparedPrompts) and pass the result where the embeddings went: the guidance
policies, cross-request batching and CUDA graphs take it as they take a tensor (it stacks, and its tensors are a
captured step's static inputs), and the network's `embed` reads it instead of projecting.

Padding keys collapse (`prepare_prompt_kv(..., key_multiple=...)`): Wan's prompts (and Helios', the same layout)
reach the DiT zero-padded to 512 tokens and every block attends to all of them without a mask. The padding rows are
exactly zero, so after the row-wise text projection and k/v projections every padding key and value of a block is
the same (k, v); softmax attention over n copies of a key with score s equals attention over m copies with score
s + log(n / m). A prompt of L real tokens is therefore kept as its L real keys and m = Lc - L copies of the padding
key with an additive key bias log(n / m) (`PromptKV.bias`, passed to SDPA as its float mask): equal to the full
attention up to float rounding, at a fraction of its work (12% of a Wan2.1-mid step attends over the 512 keys).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Sequence

import torch
from torch import Tensor

from vidloom.core.deploy import DeployConfig
from vidloom.layers.attention import ATTENTION_BACKENDS
from vidloom.layers.sharded import each_resident


@dataclass(frozen=True)
class PromptKV:
    """Every cross-attention block's keys and values of one prompt batch, [B, L, H, Dh] each, in block order.

    Rows follow the embeddings' rows; `stack` joins batches along rows (CFG's [cond; uncond], stacked requests).
    """

    keys: tuple[Tensor, ...]
    values: tuple[Tensor, ...]
    bias: Tensor | None = None
    """Collapsed padding keys (module docstring): the additive key bias [B, L] every block's attention adds to its
    scores (0 on real keys, log(n / m) on the m copies of a row's padding key, -inf on the filler `stack` adds to a
    shorter batch); None: the keys are the prompt's own, attended to without a mask."""

    @property
    def batch(self) -> int:
        return self.keys[0].shape[0]

    @property
    def dtype(self) -> torch.dtype:
        return self.keys[0].dtype

    @property
    def nbytes(self) -> int:
        bias = () if self.bias is None else (self.bias,)
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values, *bias))

    @property
    def stacked_bytes(self) -> int:
        """What its rows add to a stacked copy (runtime.batching.stacked_bytes): all of it, `stack` concatenates."""
        return self.nbytes

    def block(self, index: int) -> tuple[Tensor, Tensor]:
        """Block `index`'s (keys, values)."""
        return self.keys[index], self.values[index]

    def mask(self) -> Tensor | None:
        """The bias as SDPA's float attention mask [B, 1, 1, L] (broadcast over heads and queries), or None."""
        return None if self.bias is None else self.bias[:, None, None, :]

    def bucketed(self, bucket: int) -> PromptKV:
        """Collapsed keys padded with masked filler (zero keys and values, bias -inf) to a multiple of `bucket`
        (diffusion.prompt_kv, under CUDA graphs: one captured step per bucket, not per prompt length); keys that
        did not collapse (no bias) as they are: always the prompt's own count."""
        tokens = self.keys[0].shape[1]
        padded = -(-tokens // bucket) * bucket
        if self.bias is None or padded == tokens:
            return self
        return PromptKV(tuple(_pad_tokens(k, padded) for k in self.keys),
                        tuple(_pad_tokens(v, padded) for v in self.values), _padded_bias(self, padded))

    def rows(self, pick: slice) -> PromptKV:
        """These rows of every block's keys and values (views)."""
        return PromptKV(tuple(k[pick] for k in self.keys), tuple(v[pick] for v in self.values),
                        None if self.bias is None else self.bias[pick])

    def repeat(self, times: int) -> PromptKV:
        """Every row `times` over, in order ([r1, r2, r1, r2]): one request's rows for each CFG branch's."""
        if times == 1:
            return self
        return PromptKV(tuple(k.repeat(times, 1, 1, 1) for k in self.keys),
                        tuple(v.repeat(times, 1, 1, 1) for v in self.values),
                        None if self.bias is None else self.bias.repeat(times, 1))

    def batch_key(self) -> Hashable:
        """runtime.batching: batches of equal keys stack (same blocks, heads, dtype, device, and token count, or
        both collapsed: `stack` pads the shorter with masked filler)."""
        k = self.keys[0]
        tokens = "collapsed" if self.bias is not None else k.shape[1]
        return (len(self.keys), tokens, tuple(k.shape[2:]), k.dtype, k.device)

    @staticmethod
    def stack(batches: Sequence[PromptKV]) -> PromptKV:
        """One batch of every batch's rows, in order (BatchedCFG, runtime.batching), laid out in memory as the
        first batch's. Batches of different token counts (collapsed padding) are padded to the longest with zero
        keys and values that the bias masks out (-inf): a batch without a bias gets zeros on its own keys."""
        lengths = {b.keys[0].shape[1] for b in batches}
        if len(lengths) == 1 and all(b.bias is None for b in batches):
            return PromptKV(tuple(cat_rows(ks) for ks in zip(*(b.keys for b in batches))),
                            tuple(cat_rows(vs) for vs in zip(*(b.values for b in batches))))
        tokens = max(lengths)
        padded = lambda ts: torch.cat([_pad_tokens(t, tokens) for t in ts])  # noqa: E731
        return PromptKV(tuple(padded(ks) for ks in zip(*(b.keys for b in batches))),
                        tuple(padded(vs) for vs in zip(*(b.values for b in batches))),
                        torch.cat([_padded_bias(b, tokens) for b in batches]))

    def __repr__(self) -> str:
        # No token count: the lockstep record (runtime.parallel.rank) compares plan inputs by repr, and the ranks of
        # a --cfg-parallel pair hold different branches (whose collapsed padding may leave different counts).
        k = self.keys[0]
        return f"PromptKV(blocks={len(self.keys)}, batch={k.shape[0]}, heads={tuple(k.shape[2:])}, dtype={k.dtype})"


def _pad_tokens(t: Tensor, tokens: int) -> Tensor:
    """t [B, L, ...] with zero rows appended along L up to `tokens`."""
    extra = tokens - t.shape[1]
    return t if extra == 0 else torch.cat([t, t.new_zeros(t.shape[0], extra, *t.shape[2:])], dim=1)


def _padded_bias(batch: PromptKV, tokens: int) -> Tensor:
    """`batch`'s bias (zeros where it has none) with -inf appended up to `tokens` (the filler keys of `_pad_tokens`)."""
    k = batch.keys[0]
    bias = batch.bias if batch.bias is not None else k.new_zeros(k.shape[0], k.shape[1])
    extra = tokens - bias.shape[1]
    return bias if extra == 0 else torch.cat([bias, bias.new_full((bias.shape[0], extra), -math.inf)], dim=1)


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
                      kv: Callable[[Any, Tensor], tuple[Tensor, Tensor]] | None = None,
                      key_multiple: int | None = None) -> PromptKV:
    """Every cross-attention's `context_kv` (nn.Modules projecting their context apart from their queries, as
    models.wan.transformer.WanAttention), or `kv(attention, tokens)` (another context of theirs: Wan I2V's image
    tokens), of the prompt `embed(embeds)` (the DiT's text projection), in block order. Under --shard-weights each
    block's whole weights are gathered for its projection and freed after (layers.sharded.resident).

    `key_multiple` (a network whose padding rows are zero, unmasked, and projected row by row: Wan's text): the
    trailing zero rows collapse (module docstring, `collapsed_padding`) to a key count rounded up to a multiple
    of it; None keeps every row."""
    bias = None
    if key_multiple is not None:
        tokens_kept, bias = collapsed_padding(embeds, key_multiple)
        embeds = embeds[:, :tokens_kept]
    tokens = embed(embeds)
    pairs = each_resident(attentions, lambda attention: attention.context_kv(tokens) if kv is None
                          else kv(attention, tokens))
    return PromptKV(tuple(k for k, _ in pairs), tuple(v for _, v in pairs), bias)


PADDING_KEY_MULTIPLE = 16
"""The collapsed key count is rounded up to a multiple of this: SDPA's CPU flash kernel runs 16 keys in a quarter
of the time of 13 (1 thread, [2, 8, 768, 64] queries: 0.9 vs 3.6 ms), and the padding key's copies fill the rounding
at no cost to the result. Captured steps pad further, to runtime.prompt_buckets.PROMPT_BUCKET (`PromptKV.bucketed`)."""


def padding_key_multiple(deploy: DeployConfig) -> int | None:
    """What a network that collapses its prompt's padding keys (Wan's, Helios') is set to at load under `deploy`:
    None (every key kept) under an attention backend that takes no mask (flash/sage: the padding key's log-count
    bias is an SDPA mask) or under --compile (its blocks compile with dynamic=False per video shape bucket, and a
    key count per prompt length would recompile them: runtime.compile_buckets), else PADDING_KEY_MULTIPLE."""
    if deploy.compile or not ATTENTION_BACKENDS[deploy.attention_backend].takes_mask:
        return None
    return PADDING_KEY_MULTIPLE


COLLAPSIBLE_DTYPES = frozenset({torch.float32, torch.float64})
"""Dtypes whose padding collapses: SDPA takes a float mask in the query's dtype, and log(n / m) in bfloat16 (8
significant bits) would weigh the padding keys up to ~2% off; half-precision prompts keep every key."""


def collapsed_padding(embeds: Tensor, key_multiple: int) -> tuple[int, Tensor | None]:
    """(Lc, bias [B, Lc]) of prompt embeddings [B, L, C] whose trailing exactly-zero rows are padding: row b's
    L_b real tokens are the first L_b, rows L_b..Lc-1 of `embeds` are its padding too (zero), each standing for
    n_b / (Lc - L_b) of its n_b = L - L_b padding rows (bias log of that; 0 on real tokens). Lc is the longest
    row's L_b + 1 rounded up to `key_multiple` (PADDING_KEY_MULTIPLE), at most L; (L, None) when nothing
    collapses (a row without padding, a dtype outside COLLAPSIBLE_DTYPES). One host read per prompt, while the step
    is planned: outside any captured step."""
    batch, length = embeds.shape[:2]
    if embeds.dtype not in COLLAPSIBLE_DTYPES or length == 0:
        return length, None
    position = torch.arange(1, length + 1, device=embeds.device)
    real = (embeds.ne(0).any(-1) * position).amax(-1).tolist()  # [B]: 1 + the last nonzero row (0: all padding)
    kept = min(length, -(-(max(real) + 1) // key_multiple) * key_multiple)
    if kept >= length:
        return length, None
    bias = torch.zeros(batch, kept, dtype=embeds.dtype, device=embeds.device)
    for row, tokens in enumerate(real):
        bias[row, tokens:] = math.log((length - tokens) / (kept - tokens))
    return kept, bias


def prompt_kv_bytes(blocks: int, tokens: int, dim: int, element_size: int) -> int:
    """Bytes of one prompt row's prepared keys and values: `blocks` cross-attentions of `dim` wide K and V."""
    return blocks * 2 * tokens * dim * element_size
