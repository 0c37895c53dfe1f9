"""CUDA graphs of the paged decode step: the one-token-per-sequence forward of every AR decode loop on a network that
declares it capturable (`decode_graphs = True`: the thinker and talker of Qwen2.5-Omni and Qwen3-Omni, and
Cosmos3's backbone, which its chats decode through).

As vLLM and sglang capture decode: one graph per batch-size bucket (DECODE_BATCH_BUCKETS), the step's B sequences
padded to the smallest bucket >= B with rows that write to the pool's scratch block and whose logits are dropped.
What changes per step (token ids or input rows, positions, block tables, each row's position in its sequence)
reaches the graph through static buffers (runtime.cudagraph.GraphedStep copies them in before each replay); the KV
pool is one fixed tensor, captured by identity. The attention is paged_kv.DecodeKV: keys gathered through the block
table up to a bucketed context width (a power of two of blocks) and masked past each row's token, so no shape
depends on a value and nothing reads the device from the host inside the captured body; it sets `fixed_shapes`, so
a layer with a host-sized path takes its fixed one (Qwen3-Omni's MoE dispatch).

A graphed step gathers keys for padding rows too, each as wide as the batch's widest: PagedDecoder.memory_bytes
charges every chat under graphs for two rows of DECODE_GRAPH_MAX_CONTEXT keys (its own and one padding row), which
bounds what a bucket of at most twice the chats gathers.

A step that is not plain decode runs eagerly: a prefill (several tokens of one sequence), a prompt's media rows
(EMBEDS_AT), more sequences than the largest bucket, or a network that does not declare graphs.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import Tensor

from vidloom.core.loop import KV_SEQUENCE, StepPlan
from vidloom.runtime.cudagraph import StepGraphs
from vidloom.runtime.paged_kv import DecodeKV, PagedKVPool, blocks_for

DECODE_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
"""Decode batch sizes a graph is captured for (the small end of vLLM's default capture sizes): a step of B sequences
replays the smallest bucket >= B; a step of more than the largest runs eagerly."""
DECODE_GRAPH_MAX_CONTEXT = 8192
"""Tokens of context a captured step gathers keys over at most (vLLM's max_seq_len_to_capture default): a step whose
longest sequence needs a wider bucket runs eagerly, so no graph holds keys gathered for more (memory_bytes)."""


def declares_graphs(network: Any) -> bool:
    """Whether `network`'s decode forward is capture-safe (its class says so: `decode_graphs = True`)."""
    return bool(getattr(network, "decode_graphs", False))


def batch_bucket(rows: int) -> int | None:
    """The captured batch size a step of `rows` sequences replays (None: more than the largest bucket)."""
    return next((bucket for bucket in DECODE_BATCH_BUCKETS if bucket >= rows), None)


def context_bucket(blocks: int) -> int:
    """The block-table width a graph gathers keys over: the power of two >= `blocks` (one graph per doubling)."""
    return 1 << max(0, blocks - 1).bit_length()


def decode_step(network: Any, pool: PagedKVPool, ids: Tensor | None, embeds: Tensor | None, positions: Tensor,
                tables: Tensor, starts: Tensor, want_hidden: bool) -> Any:
    """The captured body: one decode forward of every row (ids [B] or input rows [B, width], positions [3, B]),
    its keys and values written through `tables` [B, W] at `starts` [B]. Logits [B, vocab] (and hidden [B, hidden])."""
    kv = DecodeKV(pool, tables, starts, network.attention_scale)
    # As the eager step (paged_decode.PagedDecoder._eager): hidden states and input rows only where a plan uses them,
    # so a network that feeds on ids and returns logits alone (Cosmos3's backbone) need not take those arguments.
    extra: dict[str, Any] = {"inputs_embeds": embeds} if embeds is not None else {}
    if want_hidden:
        extra["return_hidden"] = True
    return network(ids, positions, kv=kv, **extra)


class DecodeGraphs:
    """The graphed decode step of one engine (its StepGraphs: captures, replays and fallbacks count in graph_stats)."""

    def __init__(self, graphs: StepGraphs) -> None:
        self.step = graphs.get(decode_step)

    def forward(self, network: Any, pool: PagedKVPool, plans: Sequence[StepPlan], key: str,
                want_hidden: bool) -> tuple[Tensor, Tensor | None] | None:
        """The plans' logits [B, vocab] and, with `want_hidden`, hidden states [B, hidden], from a replayed graph;
        None when this step must run eagerly (a prefill, too many sequences, a network without graphs). `key`:
        "tokens", or the input-rows key of a network fed embeddings. The caller keeps media rows (EMBEDS_AT) away."""
        rows, bucket = len(plans), batch_bucket(len(plans))
        scratch = pool.scratch_block
        if (bucket is None or scratch is None or not declares_graphs(network)
                or any(p.inputs[key].shape[0] != 1 for p in plans)):
            return None
        starts = [int(p.inputs["start"]) for p in plans]
        tables = [pool.allocator.table(p.inputs[KV_SEQUENCE]) for p in plans]
        bs = pool.layout.block_size
        for table, start in zip(tables, starts):
            if blocks_for(start + 1, bs) > len(table):
                raise ValueError(f"sequence outgrew its {len(table)} reserved blocks ({start + 1} tokens)")
        width = context_bucket(max(blocks_for(start + 1, bs) for start in starts))
        if width * bs > DECODE_GRAPH_MAX_CONTEXT:
            return None
        pad = bucket - rows  # padding rows: token 0 at position 0 of the scratch block; their outputs are dropped
        padded_tables = [table[:width] + [scratch] * (width - len(table[:width])) for table in tables]
        first = plans[0].inputs[key]
        values = torch.cat([p.inputs[key] for p in plans] + [first.new_zeros((pad, *first.shape[1:]))])
        positions = torch.cat([p.inputs["positions"] for p in plans], dim=1)
        embedded = key != "tokens"
        out = self.step(
            network=network, pool=pool, ids=None if embedded else values, embeds=values if embedded else None,
            positions=torch.cat([positions, positions.new_zeros((positions.shape[0], pad))], dim=1),
            tables=torch.tensor(padded_tables + [[scratch] * width] * pad, device=first.device),
            starts=torch.tensor(starts + [0] * pad, device=first.device),
            want_hidden=want_hidden)
        logits, hidden = out if isinstance(out, tuple) else (out, None)
        return logits[:rows], None if hidden is None else hidden[:rows]
