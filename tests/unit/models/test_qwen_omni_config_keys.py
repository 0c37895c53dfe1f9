"""Qwen2.5-Omni's config reader is strict like the diffusers ones: every key transformers' Qwen2_5Omni*Config
classes have (5.x, and the 4.52 keys the published files were written with) is classified, an unknown one is
refused by name, and the sizes of an absent key match what transformers builds."""

from __future__ import annotations

import pytest

from vidloom.core.errors import CheckpointError
from vidloom.families.qwen_omni import config_keys as keys
from vidloom.families.qwen_omni.config import DecoderConfig, OmniConfig

cfgs = pytest.importorskip("transformers.models.qwen2_5_omni.configuration_qwen2_5_omni")
modeling = pytest.importorskip("transformers.models.qwen2_5_omni.modeling_qwen2_5_omni")

# part path -> (its policy, transformers' config class)
PARTS = {
    (): (keys.ROOT, cfgs.Qwen2_5OmniConfig),
    ("thinker_config",): (keys.THINKER, cfgs.Qwen2_5OmniThinkerConfig),
    ("thinker_config", "text_config"): (keys.TEXT, cfgs.Qwen2_5OmniTextConfig),
    ("thinker_config", "audio_config"): (keys.AUDIO, cfgs.Qwen2_5OmniAudioEncoderConfig),
    ("thinker_config", "vision_config"): (keys.VISION, cfgs.Qwen2_5OmniVisionEncoderConfig),
    ("talker_config",): (keys.TALKER, cfgs.Qwen2_5OmniTalkerConfig),
    ("token2wav_config",): (keys.TOKEN2WAV, cfgs.Qwen2_5OmniToken2WavConfig),
    ("token2wav_config", "dit_config"): (keys.DIT, cfgs.Qwen2_5OmniDiTConfig),
    ("token2wav_config", "bigvgan_config"): (keys.BIGVGAN, cfgs.Qwen2_5OmniBigVGANConfig),
}
# transformers 4.52.4 (the first release with these classes) wrote, besides today's keys, PreTrainedConfig's
# generation/bookkeeping attributes into every part and the 4.x rope spelling (listed from its to_dict()).
KEYS_452 = {
    ("thinker_config", "text_config"): {"rope_scaling", "rope_theta"},
    ("talker_config",): {"rope_scaling", "rope_theta"},
    ("thinker_config", "audio_config"): {"num_hidden_layers"},
    ("token2wav_config", "dit_config"): {"rope_theta"},
}
PRETRAINED_452 = {
    "add_cross_attention", "bad_words_ids", "begin_suppress_tokens", "bos_token_id", "chunk_size_feed_forward",
    "cross_attention_hidden_size", "decoder_start_token_id", "diversity_penalty", "do_sample", "early_stopping",
    "encoder_no_repeat_ngram_size", "eos_token_id", "exponential_decay_length_penalty", "finetuning_task",
    "forced_bos_token_id", "forced_eos_token_id", "id2label", "is_decoder", "is_encoder_decoder", "label2id",
    "length_penalty", "max_length", "min_length", "no_repeat_ngram_size", "num_beam_groups", "num_beams",
    "num_return_sequences", "output_attentions", "output_hidden_states", "output_scores", "pad_token_id", "prefix",
    "problem_type", "pruned_heads", "remove_invalid_values", "repetition_penalty", "return_dict",
    "return_dict_in_generate", "sep_token_id", "suppress_tokens", "task_specific_params", "temperature",
    "tf_legacy_loss", "tie_encoder_decoder", "tie_word_embeddings", "tokenizer_class", "top_k", "top_p",
    "torch_dtype", "torchscript", "typical_p", "use_bfloat16",
}


def _reference_dict() -> dict:
    return cfgs.Qwen2_5OmniConfig().to_dict()


def _part(raw: dict, path: tuple[str, ...]) -> dict:
    for name in path:
        raw = raw[name]
    return raw


@pytest.mark.parametrize("path", list(PARTS), ids=lambda p: ".".join(p) or "root")
def test_every_key_transformers_writes_is_classified(path):
    policy, _ = PARTS[path]
    written = {k for k, v in _part(_reference_dict(), path).items() if not k.endswith("_config")}
    unknown = (written | KEYS_452.get(path, set()) | PRETRAINED_452) - policy.known - policy.meta
    assert not unknown, f"{'.'.join(path) or 'root'}: classify {sorted(unknown)}"


@pytest.mark.parametrize("path", list(PARTS), ids=lambda p: ".".join(p) or "root")
def test_an_unknown_key_in_any_part_is_refused_by_name(path):
    raw = _reference_dict()
    _part(raw, path)["zz_future_key"] = 1
    with pytest.raises(CheckpointError, match=r"unsupported config key\(s\) zz_future_key"):
        OmniConfig.from_raw(raw)


def test_the_transformers_defaults_and_a_452_style_file_parse():
    raw = _reference_dict()
    for path, extra in KEYS_452.items():  # the 4.x rope spelling and generation defaults, as published files have
        part = _part(raw, path)
        part.update({"do_sample": False, "pruned_heads": {}})
        if "rope_theta" in extra:
            part.pop("rope_parameters", None)
            part["rope_theta"] = 12345.0
    config = OmniConfig.from_raw(raw)
    assert config.talker is not None and config.dit is not None
    assert config.thinker.rope_theta == config.talker.rope_theta == config.dit.rope_theta == 12345.0


def test_a_non_default_value_of_a_refused_key_names_key_value_and_why():
    raw = _reference_dict()
    raw["thinker_config"]["position_id_per_seconds"] = 13
    with pytest.raises(CheckpointError, match=r"position_id_per_seconds=13 is not supported: media/TMRoPE positions"):
        OmniConfig.from_raw(raw)


def _reference_attention(config_cls, raw: dict):
    return modeling.Qwen2_5OmniAttention(config_cls(**raw), layer_idx=0)


# The real 7B talker: hidden 896, 12 heads, head_dim 128 (not 896 // 12); sizes as the head_dim cases need.
@pytest.mark.parametrize(("talker", "raw"), [
    (True, {"hidden_size": 896, "num_attention_heads": 12}),
    (True, {"hidden_size": 896, "num_attention_heads": 12, "head_dim": 64, "num_key_value_heads": 2}),
    (False, {"hidden_size": 896, "num_attention_heads": 14}),
    (False, {"hidden_size": 896, "num_attention_heads": 14, "head_dim": 32}),
    (False, {"hidden_size": 896, "num_attention_heads": 14, "num_key_value_heads": None}),
], ids=["talker-7b", "talker-set", "text-absent", "text-set", "text-kv-null"])
def test_attention_sizes_match_transformers(talker, raw):
    ref = _reference_attention(cfgs.Qwen2_5OmniTalkerConfig if talker else cfgs.Qwen2_5OmniTextConfig, raw)
    ours = DecoderConfig.from_raw({**raw, "vocab_size": 64}, "part", talker=talker)
    assert (ours.head_dim, ours.num_key_value_heads) == (ref.head_dim, ref.k_proj.out_features // ref.head_dim)
    assert ours.num_attention_heads * ours.head_dim == ref.q_proj.out_features


def test_a_null_the_talker_class_refuses_is_refused():
    with pytest.raises(CheckpointError, match="num_key_value_heads is null"):
        DecoderConfig.from_raw({"num_key_value_heads": None}, "talker_config", talker=True)
    with pytest.raises(Exception):  # transformers' strict int field
        cfgs.Qwen2_5OmniTalkerConfig(num_key_value_heads=None)



@pytest.mark.parametrize("architecture", ["Qwen2_5OmniModel", "Qwen2_5OmniForConditionalGeneration"])
def test_the_released_and_todays_architecture_names_resolve_to_the_omni_card(tmp_path, architecture):
    import json

    from vidloom import registry

    (tmp_path / "config.json").write_text(json.dumps({**_reference_dict(), "architectures": [architecture]}))
    assert registry.resolve_card(tmp_path).family == "qwen-omni"
