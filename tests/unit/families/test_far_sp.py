"""AnyFlow-FAR's transformer under sequence parallel (every chunk's tokens and KV sharded per chunk), ranks as
threads: a whole rollout (prefill, cached steps, recompute) equals one device for Ulysses and ring attention, with
chunks and null keys that do not split."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.helpers.thread_comm import run_ranks, thread_group
from vidloom.families.wan_causal.config import FarTransformerConfig
from vidloom.families.wan_causal.demo import DEMO_TRANSFORMER
from vidloom.families.wan_causal.layout import ChunkLayout
from vidloom.families.wan_causal.parallel import ChunkShards
from vidloom.families.wan_causal.transformer import FarTransformer
from vidloom.runtime.parallel.ring import RingAttention
from vidloom.runtime.parallel.ulysses import UlyssesAttention, apply_sp

# fp32: the exchanges copy values, only summation order moves (keys gathered in rank order; observed <= 6e-7 on
# outputs of std ~1); 1e-5 still catches a pad row taken as a key or a chunk's rows misplaced (errors of order 0.1).
FP32_TOL = 1e-5
PARTITION = (1, 2, 2, 1)  # two chunks at full resolution: the last two chunks attend to compressed ones
LATENT_HW = (6, 10)  # 3 x 5 = 15 tokens a full frame, 1 x 2 a compressed one: no chunk splits over 2 or 4 ranks


def _model(heads: int) -> FarTransformer:
    config = FarTransformerConfig.from_diffusers({**DEMO_TRANSFORMER, "num_attention_heads": heads})
    torch.manual_seed(0)
    model = FarTransformer(config).eval()
    with torch.no_grad():  # sharper self-attention logits, so a missed or extra key moves the output clearly
        for block in model.blocks:
            block.self_attn.norm_q.weight.mul_(3.0)
            block.self_attn.norm_k.weight.mul_(3.0)
    return model


def _rollout(model: FarTransformer) -> tuple[list[torch.Tensor], list[int]]:
    """Every chunk's cached step and recompute prediction (CFG branches batched), and the slab's rows per rank."""
    g = torch.Generator().manual_seed(1)
    latents = torch.randn(2, 4, sum(PARTITION), *LATENT_HW, generator=g)
    t, r = torch.tensor([700.0, 700.0]), torch.tensor([300.0, 300.0])
    layouts = [ChunkLayout.for_chunk(PARTITION, k, LATENT_HW, model.config) for k in range(len(PARTITION))]
    outputs, rows = [], []
    with torch.inference_mode():
        text = model.embed_text(torch.randn(2, 5, 32, generator=g))
        cache = model.new_cache(layouts, 2, torch.device("cpu"), torch.float32)
        rows.append(cache.keys.shape[2])
        for k, layout in enumerate(layouts):
            if layout.context_frames:
                model.prefill(latents[:, :, : layout.context_frames], text, layout, cache)
            chunk = latents[:, :, layout.context_frames : layout.total_frames]
            outputs.append(model.step(chunk, t, r, text, layout, cache))
            outputs.append(model.recompute(latents[:, :, : layout.total_frames], t, r, text, layout))
            rows.append(cache.context_rows)
    return outputs, rows


@pytest.mark.parametrize(("size", "heads", "kind"), [(2, 2, UlyssesAttention), (2, 3, RingAttention),
                                                     (4, 2, RingAttention)])
def test_a_sharded_rollout_matches_one_device(size, heads, kind):
    model = _model(heads)
    reference, whole_rows = _rollout(model)

    def one_rank(comm):
        replica = copy.deepcopy(model)
        apply_sp(replica, comm)
        assert all(isinstance(layer.attention_fn, kind) for layer in replica.self_attentions())
        return _rollout(replica)

    for outputs, rows in run_ranks(thread_group(size), one_rank):
        for got, want in zip(outputs, reference):
            assert got.shape == want.shape
            assert (got - want).abs().max().item() <= FP32_TOL
        # Each rank's slab holds its rows of every chunk: about 1/size of one device's, never all of them.
        assert all(mine < whole for mine, whole in zip(rows, whole_rows) if whole)


@pytest.mark.parametrize("size", [2, 3])
def test_chunk_shards_split_every_segment_and_mask_its_pad_rows(size):
    lengths = [5, 0, 3, 7]
    x = torch.arange(sum(lengths), dtype=torch.float32)[None, :, None]

    def one_rank(comm):
        shards = ChunkShards(comm)
        local = shards.take(x, lengths)
        assert local.shape[1] == sum(shards.rows(n) for n in lengths)
        return local, shards.key_mask(lengths), shards.gather(local[:, -shards.rows(7):], 7)

    results = run_ranks(thread_group(size), one_rank)
    keys = torch.cat([local for local, _, _ in results], dim=1)[0, :, 0]
    mask = results[0][1]
    # The real keys, gathered in rank order, are every token once; the pad rows are zeros and masked.
    assert sorted(keys[mask].tolist()) == x.flatten().tolist() and keys[~mask].eq(0).all()
    for _, _, last in results:  # the last segment gathered back in token order
        assert last.flatten().tolist() == x.flatten()[-7:].tolist()
