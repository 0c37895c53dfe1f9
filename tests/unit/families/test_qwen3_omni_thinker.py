"""Qwen3-Omni's thinker pieces apart from the runtime: the interleaved mrope layout against transformers' rotary
on distinct t/h/w positions, expert routing against a per-token loop, the config reader's refusals, and experts
loaded row by row from one tensor each (a missing one named by its checkpoint key)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from vidloom.core.errors import CheckpointError
from vidloom.families.qwen3_omni.config import MoEDecoderConfig, Qwen3OmniConfig
from vidloom.families.qwen3_omni.decoder import InterleavedRotary
from vidloom.families.qwen3_omni.demo import write_demo_checkpoint
from vidloom.families.qwen3_omni.load import load_thinker, read_config
from vidloom.families.qwen3_omni.moe import SparseMoE, _grouped_mlp, _looped_mlp


@pytest.mark.parametrize("head_dim,section", [(16, [4, 2, 2]), (8, [2, 1, 1]), (32, [8, 4, 4])])
def test_interleaved_rotary_equals_transformers_on_media_positions(head_dim, section):
    from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import Qwen3OmniMoeTextConfig
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeThinkerTextRotaryEmbedding

    config = Qwen3OmniMoeTextConfig(hidden_size=4 * head_dim, num_attention_heads=4, head_dim=head_dim,
                                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                     "mrope_section": section})
    g = torch.Generator().manual_seed(0)
    positions = torch.randint(0, 50, (3, 9), generator=g)  # t, h and w differ, as for image or video tokens
    cos, sin = Qwen3OmniMoeThinkerTextRotaryEmbedding(config)(torch.zeros(1, dtype=torch.float32), positions[:, None])
    ours = InterleavedRotary(head_dim, 10000.0, tuple(section))(positions, torch.float32)
    assert torch.equal(ours[0], cos[0]) and torch.equal(ours[1], sin[0])
    flat = InterleavedRotary(head_dim, 10000.0, (head_dim // 2, 0, 0))(positions, torch.float32)
    assert not torch.equal(ours[0], flat[0])  # the h and w sections are read


@pytest.mark.parametrize("normalize,shared", [(True, 0), (False, 0), (True, 12)])
def test_sparse_moe_equals_a_per_token_sum_over_its_experts(normalize, shared):
    torch.manual_seed(0)
    moe = SparseMoE(hidden=16, inner=8, experts=6, top_k=2, normalize=normalize, shared_inner=shared)
    for p in moe.parameters():
        torch.nn.init.normal_(p, std=0.5)
    x = torch.randn(11, 16)
    probs = (x @ moe.router.T).softmax(-1)
    expected = []
    for row, p in zip(x, probs):
        weights, chosen = p.topk(2)
        weights = weights / weights.sum() if normalize else weights
        out = sum(w * (torch.nn.functional.silu(moe.gate[e] @ row) * (moe.up[e] @ row)) @ moe.down[e].T
                  for w, e in zip(weights, chosen.tolist()))
        if shared:
            out = out + torch.sigmoid(moe.shared_gate(row)) * moe.shared(row)
        expected.append(out)
    torch.testing.assert_close(moe(x), torch.stack(expected), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("counts", [[3, 0, 5, 1, 0, 2], [0, 0, 0, 0, 0, 11], [1, 1, 1, 1, 1, 1]])
def test_grouped_experts_equal_the_expert_loop(dtype, counts):
    """The grouped GEMMs (no host read of the group sizes) compute the loop's F.linear per expert, empty experts
    included: within 1e-7 of the peak in float32 (one group's GEMM may take another kernel's summation order), the
    same bfloat16 values."""
    if not hasattr(torch.nn.functional, "grouped_mm"):
        pytest.skip("this torch has no grouped_mm")
    g = torch.Generator().manual_seed(1)
    gate, up, down = (torch.randn(shape, generator=g).to(dtype) for shape in ((6, 8, 16), (6, 8, 16), (6, 16, 8)))
    rows = torch.randn(sum(counts), 16, generator=g).to(dtype)
    counts = torch.tensor(counts)
    grouped, looped = _grouped_mlp(rows, counts, gate, up, down), _looped_mlp(rows, counts, gate, up, down)
    assert (grouped - looped).abs().max() <= 1e-7 * looped.abs().max(), (grouped - looped).abs().max()


def _text(**overrides):
    return {"vocab_size": 64, "hidden_size": 16, "num_attention_heads": 2, "num_key_value_heads": 1,
            "num_hidden_layers": 1, **overrides}


def test_config_reads_defaults_and_refuses_what_it_cannot_run():
    config = MoEDecoderConfig.from_raw(_text(num_experts=4, mlp_only_layers=[0]), "text_config")
    assert (config.head_dim, config.num_experts_per_tok, config.norm_topk_prob) == (8, 8, True)
    assert not config.sparse(0)
    # the memory estimate's MLP width: the wider of the dense MLP and the top-k experts together
    assert config.intermediate_size == max(18944, 8 * 768)
    routed = MoEDecoderConfig.from_raw(_text(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=40,
                                             intermediate_size=8), "text_config")
    assert routed.intermediate_size == 80  # two experts' activations per token, wider than the dense MLP
    with pytest.raises(CheckpointError, match="rope_type 'yarn'"):
        MoEDecoderConfig.from_raw(_text(rope_parameters={"rope_type": "yarn", "factor": 4.0}), "text_config")
    written = MoEDecoderConfig.from_raw(_text(use_qk_norm=True, use_sliding_window=False,
                                              shared_expert_intermediate_size=0), "text_config")
    assert written.shared_expert_intermediate_size == 0  # the converter's Qwen3-MoE keys, at what we run
    with pytest.raises(CheckpointError, match="shared_expert_intermediate_size"):
        MoEDecoderConfig.from_raw(_text(shared_expert_intermediate_size=64), "text_config")
    with pytest.raises(CheckpointError, match="moe_router_jitter"):
        MoEDecoderConfig.from_raw(_text(moe_router_jitter=0.1), "text_config")
    with pytest.raises(CheckpointError, match="mrope_section"):
        MoEDecoderConfig.from_raw(_text(rope_parameters={"rope_type": "default", "mrope_section": [8, 8]}),
                                  "text_config")


def test_experts_load_row_by_row_and_a_missing_one_is_named(tmp_path):
    write_demo_checkpoint(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    key = "thinker.model.layers.1.mlp.experts.5.up_proj.weight"
    thinker = load_thinker(tmp_path, read_config(tmp_path), torch.device("cpu"), torch.float32)
    assert torch.equal(thinker.blocks[1].post_attention.mlp.up[5], tensors[key])
    save_file({k: v for k, v in tensors.items() if k != key}, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=f"missing tensors '{key}'"):
        load_thinker(tmp_path, read_config(tmp_path), torch.device("cpu"), torch.float32)
    raw = json.loads((tmp_path / "config.json").read_text())
    assert raw["thinker_config"]["text_config"]["mlp_only_layers"] == [2]  # the demo has a dense layer too
    assert "thinker.model.layers.2.mlp.gate_proj.weight" in tensors


def test_a_row_key_without_a_stacking_rule_is_unexpected(tmp_path):
    from vidloom.loading.name_map import NameMap
    from vidloom.loading.safetensors_io import load_weights

    module = torch.nn.Linear(4, 3, bias=False)
    save_file({"weight.1": torch.ones(4)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match="unexpected tensor 'weight.1'"):
        load_weights(module, tmp_path, NameMap(()), stem="model")  # row 1 of a plain weight: not a stacked one


def test_the_released_talker_keys_are_read_as_harmless_and_change_nothing():
    """Qwen/Qwen3-Omni-30B-A3B-Instruct's talker_config holds audio_end_token_id, seconds_per_chunk and
    output_router_logits (transformers' talker config writes them); the reader accepts them, numerics unchanged."""
    talker = {"text_config": _text(num_local_experts=2, shared_expert_intermediate_size=8), "accept_hidden_layer": 1,
              "num_code_groups": 4, "thinker_hidden_size": 16}
    raw = {"enable_audio_output": True, "thinker_config": {"text_config": _text()}, "talker_config": talker}
    released = {**talker, "audio_end_token_id": 151670, "seconds_per_chunk": 2, "output_router_logits": False}
    assert Qwen3OmniConfig.from_raw({**raw, "talker_config": released}) == Qwen3OmniConfig.from_raw(raw)
    with pytest.raises(CheckpointError, match="talker_config: unsupported config key.*codec_jitter"):
        Qwen3OmniConfig.from_raw({**raw, "talker_config": {**released, "codec_jitter": 0.1}})


def test_the_talkers_spatial_merge_size_is_read_and_must_match_the_vision_towers():
    """An image's talker rows are its thinker placeholders (grid / merge^2 of them): the talker places them with its
    own spatial_merge_size, which must merge as the vision tower does."""
    talker = {"text_config": _text(num_local_experts=2, shared_expert_intermediate_size=8), "accept_hidden_layer": 1,
              "num_code_groups": 4, "thinker_hidden_size": 16}
    thinker = {"text_config": _text(), "vision_config": {"spatial_merge_size": 4}}
    raw = {"enable_audio_output": True, "thinker_config": thinker, "talker_config": {**talker, "spatial_merge_size": 4}}
    speech = Qwen3OmniConfig.from_raw(raw).speech
    assert speech is not None and speech.spatial_merge_size == 4
    with pytest.raises(CheckpointError, match="talker_config.spatial_merge_size 2 differs from "
                                              "thinker_config.vision_config.spatial_merge_size 4"):
        Qwen3OmniConfig.from_raw({**raw, "talker_config": {**talker, "spatial_merge_size": 2}})
