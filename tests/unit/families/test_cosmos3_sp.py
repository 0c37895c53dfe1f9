"""Cosmos3's generator under sequence parallel, ranks as threads: its generated stream [vision | sound | action]
sharded (padded), each rank's prefix K/V whole, the velocities equal one device's (issue #35)."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.helpers.thread_comm import run_ranks, thread_group
from vidloom.families.cosmos3.gen_config import Cosmos3GenConfig
from vidloom.families.cosmos3.generation import ActionTokens, Cosmos3Generator
from vidloom.families.cosmos3.layout import GenLayout
from vidloom.families.cosmos3.transformer import Cosmos3Transformer
from vidloom.runtime.parallel.ring import PrefixedRing
from vidloom.runtime.parallel.ulysses import PrefixedUlysses
from vidloom.runtime.parallel.ulysses import apply_sp

# fp32: the exchanges only move values; per-head attention on fewer rows changes summation order only (observed
# <= ~1e-6); 1e-5 still catches a pad row taken as a key or a prefix slice of the wrong heads (order 1).
FP32_TOL = 1e-5
BASE = {"hidden_size": 32, "head_dim": 8, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 48, "num_hidden_layers": 2, "rope_theta": 10000.0, "rope_axes_dim": [2, 1, 1],
        "latent_channel": 4, "patch_latent_dim": 16, "rms_norm_eps": 1e-6, "vocab_size": 40, "sound_gen": True,
        "sound_dim": 6, "action_gen": True, "action_dim": 5, "num_embodiment_domains": 2}
THREE_HEADS = {**BASE, "hidden_size": 24, "num_attention_heads": 3, "num_key_value_heads": 1}


def _models(raw: dict) -> tuple[Cosmos3Transformer, Cosmos3Generator]:
    config = Cosmos3GenConfig.from_transformer_config(raw)
    torch.manual_seed(0)
    backbone, generator = Cosmos3Transformer(config.text).eval(), Cosmos3Generator(config).eval()
    with torch.no_grad():  # zero-initialised embeddings would leave the sound and action rows alike
        generator.audio_modality_embed.normal_()
        generator.action_modality_embed.normal_()
    return backbone, generator


# (config, ranks, the attention each rank runs): K/V heads split, K/V heads repeated, ring.
CASES = [(BASE, 2, PrefixedUlysses), (BASE, 4, PrefixedUlysses), (THREE_HEADS, 2, PrefixedRing)]


@pytest.mark.parametrize(("raw", "size", "kind"), CASES, ids=["ulysses2", "ulysses4-repeat", "ring2"])
def test_the_sharded_generator_matches_one_device(raw, size, kind):
    backbone, generator = _models(raw)
    config, prefix_len = generator.config, 7
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 40, (prefix_len,), generator=g)
    positions = torch.arange(prefix_len).unsqueeze(0).expand(3, -1).float()
    prefix = generator.prefill(backbone, ids, positions, torch.zeros(generator.prefix_shape(prefix_len)))
    latents = torch.randn(4, 2, 6, 4, generator=g)  # 2 frames of 3x2 patches, frame 0 clean
    sound, action = torch.randn(6, 5, generator=g), ActionTokens(torch.randn(4, 5, generator=g), 1)
    layout = GenLayout.build(config, (4, 2, 6, 4), prefix_len, 16.0, 4, (0,), 5, 4, (0,))
    assert layout.tokens % size, "the stream must be padded to split"  # 12 + 5 + 4 = 21 rows
    # One request: a batch of one (the only batch a sharded stream runs: gen_step.Cosmos3View.batch_key)
    args = (prefix[None], layout, latents[None], torch.tensor([500.0]), sound[None],
            ActionTokens(action.values[None], action.domain))
    expected = generator(backbone, *args)

    def rank(comm):
        mine = copy.deepcopy(generator)
        apply_sp(mine, comm)
        assert isinstance(mine.joint.attention_fn, kind)
        return mine(backbone, *args)

    for out in run_ranks(thread_group(size), rank):  # every rank gathers the whole stream before the heads
        for got, want in zip(out, expected):
            assert (got - want).abs().max().item() <= FP32_TOL
