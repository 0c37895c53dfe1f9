"""qwen3-omni-demo: Qwen3-Omni's thinker (the MoE text decoder), talker, code predictor and code2wav at a tiny
size with seeded random weights.

One transformers-layout folder (config.json, model.safetensors with every tensor in the released naming, one
tensor per expert, tokenizer files with Qwen3-Omni's special tokens), written once into the user's cache from our
own modules (code2wav: transformers' module, as the loader builds it) and loaded through the same loader as real
checkpoints, with the audio and vision towers and their processor settings (demo_encoders.py). Chat (with audio,
image and video parts, answered in text or aloud) and speech run offline in seconds; the weights are random, so
words and sounds are noise by design.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from vidloom.core.card import ModelCard, RecipeSpec
from vidloom.demo.cache import DemoCheckpoint, noise_note, save_merged, write_json
from vidloom.demo.tokenizer import train_chat_tokenizer
from vidloom.families.qwen3_omni.cards import AR_LOOP, ARCHITECTURE, qwen3_omni_card
from vidloom.families.qwen3_omni.config import Qwen3OmniConfig
from vidloom.families.qwen3_omni.decoder import THINKER_NAME_MAP, MoEDecoder
from vidloom.families.qwen3_omni.demo_encoders import thinker_media_config, tower_parts, write_processors
from vidloom.families.qwen3_omni.load import WEIGHTS_STEM
from vidloom.families.qwen3_omni.talker import TALKER_NAME_MAP, Talker
from vidloom.loading.name_map import NameMap

DEMO_ID = "qwen3-omni-demo"
DEMO_VERSION = 4  # bump when the demo's architecture or files change
DEMO_SEED = 20261206
DEMO_NOTE = noise_note(DEMO_ID, "Qwen3-Omni", "Qwen/Qwen3-Omni-30B-A3B-Instruct", layout="transformers")
# Qwen3-Omni's template: text turns as ChatML, an audio part as <|audio_start|><|audio_pad|><|audio_end|>, an
# image as <|vision_start|><|image_pad|><|vision_end|>, a video as <|vision_start|><|video_pad|><|vision_end|> (the
# released chat_template's rendering).
CHAT_TEMPLATE = (
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n"
    "{%- if m.content is string %}{{ m.content }}{% else %}"
    "{%- for p in m.content %}{% if p.type == 'text' %}{{ p.text }}"
    "{% elif p.type == 'audio' %}<|audio_start|><|audio_pad|><|audio_end|>"
    "{% elif p.type == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif p.type == 'video' %}<|vision_start|><|video_pad|><|vision_end|>{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# The released tokenizer's special tokens (tokenizer_config.json of Qwen/Qwen3-Omni-30B-A3B-Instruct).
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|audio_start|>", "<|audio_end|>", "<|audio_pad|>",
            "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>", "<tts_pad>", "<tts_text_bos>",
            "<tts_text_eod>", "<tts_text_bos_single>")
CORPUS = ("the kite rose over the dunes and the wind sang", "tell me about kites in one sentence please",
          "hello world! the quick brown fox jumps over the lazy dog 1 2 3",
          "system user assistant you are a helpful assistant", "experts route every token to a few of many")
# Every feature of the released thinker at a tiny size: top-k routing with renormalised weights, q/k norms,
# head_dim apart from hidden_size / heads, interleaved mrope sections, one dense layer (mlp_only_layers).
THINKER = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
               num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16,
               norm_topk_prob=True, mlp_only_layers=[2], rms_norm_eps=1e-6,
               rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [4, 2, 2],
                                "interleaved": True})


# The talker at a tiny size: codes below vocab - 1024 (generate() suppresses the top 1024 ids but the end id).
TALKER = dict(vocab_size=1088, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=8, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
              shared_expert_intermediate_size=32, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0,
                                                                   "mrope_section": [2, 1, 1], "interleaved": True})
CODE_GROUPS = 4
PREDICTOR = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=8, num_code_groups=CODE_GROUPS)
# 240x upsampling (the released one is 1920x at 12.5 frames/s): 100 frames/s at 24 kHz.
CODE2WAV = dict(codebook_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                intermediate_size=48, num_quantizers=CODE_GROUPS, upsample_rates=[5, 4, 3], upsampling_ratios=[2, 2],
                decoder_dim=32, sliding_window=16)
VOICES = ("ethan", "chelsie", "aiden")  # the released checkpoint's speaker names


def demo_card() -> ModelCard:
    card = qwen3_omni_card(DEMO_ID, f"demo:{DEMO_ID}", precision="float32", notes=(DEMO_NOTE,), speaks=True,
                           description="Qwen3-Omni (MoE; chat, speech), tiny, random weights")
    return dataclasses.replace(card, recipe=RecipeSpec(method="random-init", loop=AR_LOOP))


def _role_id(tokenizer, role: str) -> int:
    """The id after <|im_start|> in a `role` turn (what generate() reads as the role)."""
    ids = tokenizer.apply_chat_template([{"role": role, "content": "hi"}], tokenize=True, return_dict=True)
    ids = list(ids["input_ids"])
    return ids[ids.index(tokenizer.convert_tokens_to_ids("<|im_start|>")) + 1]


def _speech_config(tokenizer) -> dict:
    ids = {name: tokenizer.convert_tokens_to_ids(name) for name in SPECIALS}
    top = TALKER["vocab_size"]
    talker = {"text_config": TALKER, "code_predictor_config": PREDICTOR, "num_code_groups": CODE_GROUPS,
              "accept_hidden_layer": 2, "thinker_hidden_size": THINKER["hidden_size"], "codec_eos_token_id": top - 2,
              "codec_nothink_id": top - 10, "codec_think_bos_id": top - 9, "codec_think_eos_id": top - 8,
              "codec_pad_id": top - 7, "codec_bos_id": top - 6,
              "speaker_id": {name: top - 20 + n for n, name in enumerate(VOICES)}}
    return {"talker_config": talker, "code2wav_config": CODE2WAV, "im_start_token_id": ids["<|im_start|>"],
            "im_end_token_id": ids["<|im_end|>"], "tts_pad_token_id": ids["<tts_pad>"],
            "tts_bos_token_id": ids["<tts_text_bos>"], "tts_eos_token_id": ids["<tts_text_eod>"],
            "user_token_id": _role_id(tokenizer, "user"), "assistant_token_id": _role_id(tokenizer, "assistant"),
            "system_token_id": _role_id(tokenizer, "system")}


def _redraw(module: torch.nn.Module, unit: tuple[str, ...]) -> None:
    """Unit-scale weights (`unit`-prefixed ones: embeddings and heads, unit logits): greedy ids vary step by step
    and routers pick different experts."""
    with torch.no_grad():
        for name, param in module.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            elif param.ndim >= 2:
                param.normal_(0.0, 1.0 if name.startswith(unit) else param.shape[-1] ** -0.5)
            else:
                param.zero_()


def write_demo_checkpoint(folder: Path) -> None:
    from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import Qwen3OmniMoeCode2WavConfig
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import Qwen3OmniMoeCode2Wav

    tokenizer = train_chat_tokenizer(CORPUS, SPECIALS, CHAT_TEMPLATE)
    tokenizer.save_pretrained(str(folder))
    ids = {name: tokenizer.convert_tokens_to_ids(name) for name in SPECIALS}
    thinker_raw = {"text_config": {**THINKER, "vocab_size": len(tokenizer)},
                   **thinker_media_config(THINKER["hidden_size"], ids)}
    raw = {"architectures": [ARCHITECTURE], "model_type": "qwen3_omni_moe", "enable_audio_output": True,
           "thinker_config": thinker_raw, **_speech_config(tokenizer)}
    config = Qwen3OmniConfig.from_raw(raw)
    torch.manual_seed(DEMO_SEED)
    thinker, talker = MoEDecoder(config.thinker), Talker(config)
    _redraw(thinker, ("embed", "head"))
    _redraw(talker, ("decoder.embed", "decoder.head", "predictor.embeds", "predictor.heads"))
    code2wav = torch.nn.ModuleDict({"module": Qwen3OmniMoeCode2Wav(Qwen3OmniMoeCode2WavConfig(**CODE2WAV))})
    with torch.no_grad():  # audible: transformers' init (std 0.02, layer scales near 0) is near silence
        for name, param in code2wav.named_parameters():
            if param.ndim >= 2:  # linears and convs [out, in, k]
                param.normal_(0.0, 0.5 * param[0].numel() ** -0.5)
            elif "norm" not in name:  # biases, layer scales, snake alpha/beta
                param.normal_(0.0, 0.1)
    save_merged(folder, ((thinker, THINKER_NAME_MAP), (talker, TALKER_NAME_MAP),
                         (code2wav, NameMap((("code2wav", "module"),))),
                         *tower_parts(thinker_raw, DEMO_SEED + 1)), stem=WEIGHTS_STEM)
    write_processors(folder)
    write_json(folder / "config.json", raw)  # last: the folder's completeness marker


ensure_demo_checkpoint = DemoCheckpoint(DEMO_ID, DEMO_VERSION, write_demo_checkpoint, marker="config.json").ensure
