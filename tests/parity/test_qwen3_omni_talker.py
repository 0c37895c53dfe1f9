"""Qwen3-Omni's talker decoder (our MoE decoder: every layer sparse, with a sigmoid-gated shared expert) against
transformers' `talker.model` + `codec_head` on a tiny random checkpoint: codec logits for the same input rows,
prefilled then decoded token by token through the paged KV pool, within LOGITS. (Its inputs and code
predictor: tests/parity/test_qwen3_omni_speech_codes.py.)"""

from __future__ import annotations

import pytest
import torch

from tests.helpers.qwen3_omni_checkpoints import TALKER_A, THINKER_A, load_reference, write_tiny_thinker
from vidloom.families.qwen3_omni.load import load_talker, read_config
from vidloom.families.qwen3_omni.moe import SparseMoE
from vidloom.layers.rotary import text_positions
from vidloom.runtime.paged_kv import KVLayout, PagedKVPool

# float32; expert sums run in another order than the reference's (measured through the pool: max |diff| 6.0e-6
# on logits up to 21).
LOGITS = 1e-4


@pytest.fixture(scope="module")
def talker(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    folder = write_tiny_thinker(tmp_path_factory.mktemp("q3-talker"), THINKER_A, talker=TALKER_A)
    yield (load_talker(folder, read_config(folder), torch.device("cpu"), torch.float32).decoder,
           load_reference(folder))
    torch.set_num_threads(threads)


def test_every_talker_layer_routes_through_experts_and_a_shared_expert(talker):
    ours, _ = talker
    for block in ours.blocks:
        mlp = block.post_attention.mlp
        assert isinstance(mlp, SparseMoE) and mlp.shared is not None


def test_paged_codec_logits_within_tolerance(talker):
    ours, reference = talker
    config = ours.config
    rows = torch.randn(20, config.hidden_size, generator=torch.Generator().manual_seed(5))
    pool = PagedKVPool(KVLayout(config.num_hidden_layers, config.num_key_value_heads, config.head_dim, num_blocks=2),
                       torch.device("cpu"), torch.float32)
    pool.allocator.reserve("talk", 32)
    with torch.inference_mode():
        theirs = reference.talker.codec_head(reference.talker.model(inputs_embeds=rows[None]).last_hidden_state)[0]
        steps = [(0, 12)] + [(n, 1) for n in range(12, 20)]
        logits = torch.cat([ours(None, text_positions(start, count), inputs_embeds=rows[start:start + count],
                                 kv=pool.batch([("talk", start, count)], ours.attention_scale))
                            for start, count in steps])
        down = ours.blocks[0].post_attention.mlp.shared.down.weight
        kept = down.clone()
        down.zero_()  # the first layer's shared expert silenced
        without = ours(None, text_positions(0, 20), inputs_embeds=rows)
        down.copy_(kept)
    assert (logits - theirs).abs().max().item() <= LOGITS
    assert (without - theirs).abs().max().item() > 100 * LOGITS  # the shared expert's share is compared too
