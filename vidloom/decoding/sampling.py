"""Next-token choice for one sequence: greedy, or temperature -> top-k -> top-p sampling with its own RNG.

The order (temperature, then top-k, then top-p over what is left) is transformers' logits-warper
order, so a seeded request picks from the same distribution there and here.
"""

from __future__ import annotations

import secrets

import torch
from torch import Tensor

from vidloom.core.chat import SamplingParams


def make_generator(params: SamplingParams) -> torch.Generator | None:
    """The sequence's RNG: seeded from the request (reproducible) or from the OS; None when greedy.

    A CPU generator: sampling runs on the step's logits copied to the host once per step, so a seed
    draws the same tokens whatever device computed the logits.
    """
    if params.greedy:
        return None
    generator = torch.Generator()
    generator.manual_seed(params.seed if params.seed is not None else secrets.randbits(63))
    return generator


def next_token(logits: Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """One token id from host `logits` [vocab] (float32 math whatever the model's dtype)."""
    logits = logits.float()
    if params.greedy or generator is None:
        return int(torch.argmax(logits))
    logits = logits / params.temperature
    if 0 < params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        logits = _nucleus(logits, params.top_p)
    probs = torch.softmax(logits, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


def _nucleus(logits: Tensor, top_p: float) -> Tensor:
    """Keep the smallest set of most likely tokens whose probability reaches top_p (at least one)."""
    ordered, order = torch.sort(logits, descending=True)
    cumulative = torch.softmax(ordered, dim=-1).cumsum(-1)
    drop = cumulative - torch.softmax(ordered, dim=-1) >= top_p  # mass before this token already reaches top_p
    drop[0] = False
    return logits.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
