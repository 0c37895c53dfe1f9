"""Continuous batching of AR decode steps: the planned steps of all running sequences as one forward.

Each "ar_decode" StepPlan feeds its sequence's new tokens (a whole prompt when it just joined, else
the last sampled token). Their tokens are packed along one axis, the paged KV pool resolves what
each token attends to, and the lm head runs on each sequence's last token only.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from vidloom.core.loop import StepPlan
from vidloom.runtime.paged_kv import PagedKVPool


def run_decode_batch(plans: Sequence[StepPlan], pool: PagedKVPool) -> list[Tensor]:
    """Execute the plans (same network) in one forward; returns each plan's last-token logits [vocab]."""
    network = plans[0].call
    if any(p.call is not network for p in plans):
        raise ValueError("ar_decode plans of one batch must share their network")
    tokens = torch.cat([p.inputs["tokens"] for p in plans])
    positions = torch.cat([p.inputs["positions"] for p in plans], dim=1)
    sizes = [int(p.inputs["tokens"].shape[0]) for p in plans]
    last = torch.tensor(sizes, device=tokens.device).cumsum(0) - 1
    kv = pool.batch([(p.inputs["seq"], p.inputs["start"], n) for p, n in zip(plans, sizes)],
                    network.attention_scale)
    logits = network(tokens, positions, kv=kv, logits_at=last)
    return list(logits.unbind(0))
