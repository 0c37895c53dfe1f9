"""Ring attention (runtime/parallel/ring.py) with ranks as threads: equal to attention over the whole sequence for
any head count, padded or not, and a Wan DiT whose heads sp does not divide equal to one device."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.helpers.thread_comm import run_ranks, thread_group
from vidloom.layers.attention import attention
from vidloom.models.wan.transformer import WanTransformer
from vidloom.models.wan.transformer_config import WanTransformerConfig
from vidloom.runtime.parallel.ring import RingAttention
from vidloom.runtime.parallel.ulysses import apply_sp

# fp32: a query's softmax is split into per-block pieces merged by log-sum-exp, so only rounding moves (observed
# <= 6e-7); 1e-5 still catches a block attended twice or missed (errors of order 1).
FP32_TOL = 1e-5


def _qkv(seq: int, heads: int, dim: int = 8) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seq * 10 + heads)
    return tuple(torch.randn(2, seq, heads, dim, generator=g) * scale for scale in (1.0, 0.7, 1.3))


@pytest.mark.parametrize(("size", "heads"), [(2, 3), (3, 2), (4, 3), (3, 4)])
@pytest.mark.parametrize("real", [12, 10, 7])
def test_ring_attention_equals_attention_over_the_whole_sequence(size, heads, real):
    """`real` tokens of a sequence padded to split over `size` ranks: the pad rows are no keys."""
    padded = real + (-real % size)
    q, k, v = _qkv(padded, heads)
    full = attention(q[:, :real], k[:, :real], v[:, :real])
    mask = torch.arange(padded) < real if padded > real else None
    local = padded // size

    def rank(comm):
        rows = slice(comm.rank * local, (comm.rank + 1) * local)
        return RingAttention(comm, query_chunk=3)(q[:, rows], k[:, rows], v[:, rows], mask)

    out = torch.cat(run_ranks(thread_group(size), rank), dim=1)[:, :real]
    assert (out - full).abs().max().item() <= FP32_TOL


def test_ring_attention_refuses_any_mask_but_a_padded_sequence_s():
    (comm,) = thread_group(1)
    q = torch.zeros(1, 4, 2, 8)
    with pytest.raises(ValueError, match=r"only a padded sequence's key mask \(\[4\] bool on the CPU\)"):
        RingAttention(comm)(q, q, q, torch.ones(1, 1, 4, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="k, v of one shape and q of their batch, heads and head size"):
        RingAttention(comm)(q, q[:, :, :1], q[:, :, :1])


@pytest.mark.parametrize("size", [2, 4])
def test_a_wan_dit_whose_heads_sp_does_not_divide_matches_one_device(size):
    config = WanTransformerConfig(num_attention_heads=3, attention_head_dim=12, in_channels=4, out_channels=4,
                                  text_dim=16, freq_dim=16, ffn_dim=32, num_layers=2)
    torch.manual_seed(0)
    model = WanTransformer(config).eval()
    latents, timestep, text = torch.randn(1, 4, 2, 4, 4), torch.tensor([500.0]), torch.randn(1, 5, 16)  # 8 tokens
    with torch.inference_mode():
        reference = model(latents, timestep, text)

    def rank(comm):
        replica = copy.deepcopy(model)
        apply_sp(replica, comm)
        assert all(isinstance(layer.attention_fn, RingAttention) for layer in replica.self_attentions())
        with torch.inference_mode():
            return replica(latents, timestep, text)

    for out in run_ranks(thread_group(size), rank):
        assert (out - reference).abs().max().item() <= FP32_TOL
