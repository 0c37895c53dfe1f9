"""Ulysses all-to-all layout and sequence-parallel forwards, with ranks as threads (no processes)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist

from tests.helpers.thread_comm import run_ranks, thread_group
from vidloom.layers.attention import attention
from vidloom.models.wan.transformer import WanTransformer
from vidloom.models.wan.transformer_config import WanTransformerConfig
from vidloom.runtime.parallel.comm import GroupComm
from vidloom.runtime.parallel.ring import RingAttention
from vidloom.runtime.parallel.ulysses import TokenShards, UlyssesAttention, apply_sp, heads_to_seq, seq_to_heads

# fp32: the exchanges only move values; ranks see smaller matmuls and per-head attention, so
# only summation order in kernels may change. Observed 0 to ~1e-7; 1e-5 still catches a wrong
# token or head order (errors of order 1).
FP32_TOL = 1e-5


def _x(batch: int = 2, seq: int = 12, heads: int = 4, dim: int = 8) -> torch.Tensor:
    return torch.randn(batch, seq, heads, dim, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("size", [2, 4])
def test_seq_to_heads_gives_all_tokens_of_my_heads_and_back(size):
    x = _x()
    seq, heads = x.shape[1] // size, x.shape[2] // size

    def rank(comm):
        local = x[:, comm.rank * seq : (comm.rank + 1) * seq]
        swapped = seq_to_heads(local, comm)
        return swapped, heads_to_seq(swapped, comm), local

    for r, (swapped, back, local) in enumerate(run_ranks(thread_group(size), rank)):
        assert torch.equal(swapped, x[:, :, r * heads : (r + 1) * heads])  # moves values, exactly
        assert torch.equal(back, local)


def test_leading_dims_ride_along():
    # UlyssesAttention exchanges q, k and v stacked: [3, B, S/P, H, Dh].
    qkv = torch.stack([_x(), _x() + 1, _x() + 2])

    def rank(comm):
        return seq_to_heads(qkv[:, :, comm.rank * 6 : (comm.rank + 1) * 6], comm)

    for r, swapped in enumerate(run_ranks(thread_group(2), rank)):
        assert torch.equal(swapped, qkv[:, :, :, r * 2 : (r + 1) * 2])


@pytest.mark.parametrize("size", [2, 4])
def test_ulysses_attention_equals_attention_over_the_whole_sequence(size):
    q, k, v = _x(), _x() * 0.5, _x() - 1
    full = attention(q, k, v)
    seq = q.shape[1] // size

    def rank(comm):
        rows = slice(comm.rank * seq, (comm.rank + 1) * seq)
        return UlyssesAttention(attention, comm)(q[:, rows], k[:, rows], v[:, rows])

    out = torch.cat(run_ranks(thread_group(size), rank), dim=1)
    assert (out - full).abs().max().item() <= FP32_TOL


def test_token_shards_split_rows_and_gather_in_order():
    tokens, table = torch.arange(2 * 6 * 3.0).reshape(2, 6, 3), torch.arange(6.0)[:, None]

    def rank(comm):
        layout = TokenShards(comm)
        local, (rows,) = layout.shard(tokens, (table,))
        return local, rows, layout.gather(local)

    for r, (local, rows, gathered) in enumerate(run_ranks(thread_group(3), rank)):
        assert torch.equal(local, tokens[:, 2 * r : 2 * r + 2]) and torch.equal(rows, table[2 * r : 2 * r + 2])
        assert torch.equal(gathered, tokens)


def test_shard_refuses_a_sequence_that_does_not_split():
    (comm,) = thread_group(1)
    comm.size = 4  # only the size matters before any exchange
    with pytest.raises(ValueError, match="no padding"):
        TokenShards(comm).shard(torch.zeros(1, 6, 2), ())


TINY = WanTransformerConfig(
    num_attention_heads=4, attention_head_dim=12, in_channels=4, out_channels=4, text_dim=16,
    freq_dim=16, ffn_dim=32, num_layers=2,
)


@pytest.mark.parametrize("size", [2, 4])
def test_sp_transformer_matches_one_device(size):
    torch.manual_seed(0)
    model = WanTransformer(TINY).eval()
    latents = torch.randn(1, 4, 2, 4, 6)  # patch grid 2 x 2 x 3 = 12 tokens
    timestep, text = torch.tensor([700.0]), torch.randn(1, 5, 16)
    with torch.inference_mode():
        reference = model(latents, timestep, text)

    def rank(comm):
        replica = copy.deepcopy(model)
        apply_sp(replica, comm)
        with torch.inference_mode():
            return replica(latents, timestep, text)

    for out in run_ranks(thread_group(size), rank):
        assert (out - reference).abs().max().item() <= FP32_TOL
    assert model.sequence.gather(latents) is latents  # the original keeps the one-device layout


def test_apply_sp_takes_ring_attention_where_the_heads_do_not_split():
    comms = thread_group(3)
    model = WanTransformer(TINY)  # 4 heads
    apply_sp(model, comms[0])
    assert {type(layer.attention_fn) for layer in model.self_attentions()} == {RingAttention}
    model = WanTransformer(TINY)
    apply_sp(model, thread_group(2)[0])
    assert {type(layer.attention_fn) for layer in model.self_attentions()} == {UlyssesAttention}


def test_group_comm_on_a_one_rank_gloo_group():
    # The torch.distributed path (shapes, dtypes) without processes; several ranks run in tests/integration.
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        comm = GroupComm(dist.group.WORLD, 0, 1)
        x = _x()
        assert torch.equal(comm.all_gather(x), x[None])
        assert torch.equal(seq_to_heads(x, comm), x) and torch.equal(heads_to_seq(x, comm), x)
        assert torch.equal(comm.shift(x), x)
        with pytest.raises(ValueError, match="leading dim of 1"):
            comm.all_to_all(torch.zeros(2, 3))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("size", [2, 4])
def test_sp_matches_one_device_with_per_token_timesteps_and_image_tokens(size):
    # Wan2.2 TI2V's per-token modulation is sharded with the tokens; Wan2.1 I2V's image tokens are
    # cross-attention context (whole on every rank).
    config = WanTransformerConfig(
        num_attention_heads=4, attention_head_dim=12, in_channels=4, out_channels=4, text_dim=16,
        freq_dim=16, ffn_dim=32, num_layers=2, image_dim=10, added_kv_proj_dim=48,
    )
    torch.manual_seed(0)
    model = WanTransformer(config).eval()
    latents = torch.randn(1, 4, 2, 4, 6)  # 12 tokens
    timestep = torch.full((1, 12), 700.0)
    timestep[:, :6] = 0.0  # the first latent frame kept clean
    text, image = torch.randn(1, 5, 16), torch.randn(1, 3, 10)
    with torch.inference_mode():
        reference = model(latents, timestep, text, image)

    def rank(comm):
        replica = copy.deepcopy(model)
        apply_sp(replica, comm)
        with torch.inference_mode():
            return replica(latents, timestep, text, image)

    for out in run_ranks(thread_group(size), rank):
        assert (out - reference).abs().max().item() <= FP32_TOL
