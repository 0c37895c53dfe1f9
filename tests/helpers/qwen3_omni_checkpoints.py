"""Tiny Qwen3-Omni checkpoints (random weights, offline tokenizer) for parity tests.

Written by transformers' `Qwen3OmniMoeForConditionalGeneration.save_pretrained` (text-only unless a talker is
asked for: then the talker, its code predictor and code2wav, enable_audio_output true; the towers are the
smallest the config classes allow). Two thinker configurations differ in what the MoE decoder reads: experts and top-k, norm_topk_prob, an explicit head_dim
against the derived one, attention biases, a dense layer (mlp_only_layers), rope theta and mrope sections.
Weights are redrawn at unit scale (logits of order one, so greedy ids change from step to step and routers pick
different experts per token) and never near float32 denormals.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from vidloom.demo.tokenizer import train_chat_tokenizer
from vidloom.families.qwen3_omni.demo import CHAT_TEMPLATE, CORPUS, SPECIALS
from vidloom.models.omni_towers import write_processor_config

# The towers' feature extractor and image processor (preprocessor_config.json): 16 mel bins (the audio tower's
# num_mel_bins), 4 s clips (a too-long one fits a request body), 16-pixel patches (the vision tower's default
# patch_size), at most 8x8 patches.
MEL_BINS, AUDIO_CHUNK_S, PATCH_SIZE, MAX_IMAGE_PIXELS = 16, 4, 16, 128 * 128
TOWER_GAIN = 2.0  # the towers' weights in units of 1/sqrt(fan_in)


@dataclass(frozen=True)
class TinyThinker:
    name: str
    text: dict[str, Any]


def mrope(theta: float, section: list[int]) -> dict[str, Any]:
    """The thinker's interleaved multimodal rotary parameters (`section`: the t, h, w split of half a head)."""
    return {"rope_type": "default", "rope_theta": theta, "mrope_section": section, "interleaved": True}


THINKER_A = TinyThinker("moe-a", dict(
    hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, norm_topk_prob=True,
    rope_parameters=mrope(1000000.0, [4, 2, 2])))
THINKER_B = TinyThinker("moe-b", dict(
    hidden_size=48, intermediate_size=40, num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=3,
    num_experts=8, num_experts_per_tok=3, moe_intermediate_size=24, norm_topk_prob=False, attention_bias=True,
    mlp_only_layers=[1], rope_parameters=mrope(10000.0, [2, 1, 1])))
THINKERS = (THINKER_A, THINKER_B)
# Two tiny talkers (its MoE decoder: every layer sparse, with a sigmoid-gated shared expert; its code predictor;
# code2wav; the predictor is as wide as the talker, which feeds it its hidden state).
# The codec vocab is over 1024 because generate() suppresses the top 1024 ids but the end id: codes live
# below vocab - 1024 (the codebook), the special ids above.
@dataclass(frozen=True)
class TinyTalker:
    name: str
    text: dict[str, Any]
    predictor: dict[str, Any]
    code_groups: int
    accept_hidden_layer: int
    codebook: int  # code2wav's codebook_size (= vocab - 1024 here)


TALKER_A = TinyTalker("talker-a", dict(
    vocab_size=1064, hidden_size=24, intermediate_size=40, num_hidden_layers=2, num_attention_heads=2,
    num_key_value_heads=1, head_dim=12, num_experts=6, num_experts_per_tok=2, moe_intermediate_size=8,
    shared_expert_intermediate_size=20, rope_parameters=mrope(1000000.0, [2, 2, 2])),
    dict(vocab_size=40, hidden_size=24, intermediate_size=24, num_hidden_layers=1, num_attention_heads=2,
         num_key_value_heads=1, head_dim=8), code_groups=4, accept_hidden_layer=1, codebook=40)
TALKER_B = TinyTalker("talker-b", dict(
    vocab_size=1080, hidden_size=32, intermediate_size=24, num_hidden_layers=3, num_attention_heads=4,
    num_key_value_heads=2, head_dim=8, num_experts=4, num_experts_per_tok=3, moe_intermediate_size=12,
    shared_expert_intermediate_size=16, norm_topk_prob=True, rope_parameters=mrope(10000.0, [1, 1, 2])),
    dict(vocab_size=56, hidden_size=32, intermediate_size=32, num_hidden_layers=2, num_attention_heads=3,
         num_key_value_heads=3, head_dim=8, attention_bias=True, rope_parameters={"rope_type": "default",
                                                                                  "rope_theta": 10000.0}),
    code_groups=6, accept_hidden_layer=2, codebook=56)
TALKERS = (TALKER_A, TALKER_B)
CODE2WAV = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                intermediate_size=24, upsample_rates=[2, 2], upsampling_ratios=[2], decoder_dim=16, sliding_window=8)


def train_tokenizer():
    return train_chat_tokenizer(CORPUS, SPECIALS, CHAT_TEMPLATE, vocab_size=300)


def omni_config(spec: TinyThinker, tokenizer, talker: TinyTalker | None = None):
    from transformers import Qwen3OmniMoeConfig

    hidden = spec.text["hidden_size"]
    ids = {name: tokenizer.convert_tokens_to_ids(name) for name in SPECIALS}
    thinker = dict(
        text_config=dict(vocab_size=len(tokenizer), **spec.text),
        audio_config=dict(num_mel_bins=MEL_BINS, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=16,
                          d_model=16, output_dim=hidden),
        vision_config=dict(depth=1, hidden_size=16, intermediate_size=16, num_heads=2, out_hidden_size=hidden,
                           deepstack_visual_indexes=[0]),
        audio_token_id=ids["<|audio_pad|>"], image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        audio_start_token_id=ids["<|audio_start|>"], audio_end_token_id=ids["<|audio_end|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"])
    if talker is None:
        return Qwen3OmniMoeConfig(thinker_config=thinker, enable_audio_output=False,
                                  im_start_token_id=ids["<|im_start|>"], im_end_token_id=ids["<|im_end|>"])
    vocab = talker.text["vocab_size"]
    talker_config = dict(text_config=talker.text, code_predictor_config={**talker.predictor,
                                                                         "num_code_groups": talker.code_groups},
                         num_code_groups=talker.code_groups, accept_hidden_layer=talker.accept_hidden_layer,
                         thinker_hidden_size=hidden, codec_eos_token_id=vocab - 2, codec_nothink_id=vocab - 10,
                         codec_think_bos_id=vocab - 9, codec_think_eos_id=vocab - 8, codec_pad_id=vocab - 7,
                         codec_bos_id=vocab - 6, speaker_id={"ethan": vocab - 20, "chelsie": vocab - 19},
                         audio_token_id=ids["<|audio_pad|>"], image_token_id=ids["<|image_pad|>"],
                         video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
                         audio_start_token_id=ids["<|audio_start|>"], spatial_merge_size=2)
    code2wav = {**CODE2WAV, "codebook_size": talker.codebook, "num_quantizers": talker.code_groups}
    return Qwen3OmniMoeConfig(thinker_config=thinker, talker_config=talker_config, code2wav_config=code2wav,
                              enable_audio_output=True, im_start_token_id=ids["<|im_start|>"],
                              im_end_token_id=ids["<|im_end|>"], tts_pad_token_id=ids["<tts_pad>"],
                              tts_bos_token_id=ids["<tts_text_bos>"], tts_eos_token_id=ids["<tts_text_eod>"],
                              user_token_id=role_token(tokenizer, "user"),
                              assistant_token_id=role_token(tokenizer, "assistant"),
                              system_token_id=role_token(tokenizer, "system"))


def role_token(tokenizer, role: str) -> int:
    """The id after <|im_start|> in a `role` turn (the tiny tokenizer may split the role's word; its first piece
    is what generate() reads)."""
    ids = tokenizer.apply_chat_template([{"role": role, "content": "hello"}], tokenize=True,
                                        return_dict=True)["input_ids"]
    return ids[ids.index(tokenizer.convert_tokens_to_ids("<|im_start|>")) + 1]


def build_model(spec: TinyThinker, seed: int = 0, talker: TinyTalker | None = None):
    """transformers' model, float32, with the thinker's (and the talker's) decoder redrawn at unit scale."""
    from transformers import Qwen3OmniMoeForConditionalGeneration

    tokenizer = train_tokenizer()
    torch.manual_seed(seed)
    model = Qwen3OmniMoeForConditionalGeneration(omni_config(spec, tokenizer, talker)).eval().float()
    g = torch.Generator().manual_seed(seed + 7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.startswith(("thinker.model", "thinker.lm_head", "talker.", "code2wav.")):
                continue
            noise = torch.randn(p.shape, generator=g)
            if name.startswith("code2wav.") and p.ndim >= 2:  # convs [out, in, k] too: audible samples
                p.copy_(0.5 * noise / p[0].numel() ** 0.5)
            elif name.startswith("code2wav.") and "norm" not in name:  # biases, layer scales, snake alpha/beta
                p.copy_(0.1 * noise)
            elif "norm" in name:  # RMSNorm weights start at 1: a missing norm weight would go unnoticed
                p.copy_(1.0 + 0.2 * noise)
            elif "embed_tokens" in name or "lm_head" in name or "codec_embedding" in name or "codec_head" in name:
                p.copy_(noise)  # unit-scale logits: greedy ids differ per step
            elif p.ndim >= 2:  # projections, routers and stacked experts [E, out, in]: unit-variance outputs
                p.copy_(noise / p.shape[-1] ** 0.5)
            else:  # attention biases
                p.copy_(0.1 * noise)
    _redraw_towers(model, torch.Generator().manual_seed(seed + 11))
    return model, tokenizer


def _redraw_towers(model, g: torch.Generator) -> None:
    """The audio and vision towers loud enough that their inputs steer the reply (transformers' init, std 0.02,
    gives near-constant rows): matrices and convolutions ~ 1/sqrt(fan_in), norms near 1, biases small."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.startswith(("thinker.audio_tower.", "thinker.visual.")):
                continue
            noise = torch.randn(p.shape, generator=g)
            if p.ndim >= 2:
                p.copy_(TOWER_GAIN * noise / p[0].numel() ** 0.5)
            elif "norm" in name or "ln" in name.split(".")[-2]:
                p.copy_(1.0 + 0.1 * noise)
            else:
                p.copy_(0.02 * noise)


def write_tiny_thinker(folder: Path, spec: TinyThinker = THINKER_A, seed: int = 0,
                       talker: TinyTalker | None = None) -> Path:
    """Save a tiny Qwen3-Omni folder (config.json, model.safetensors, tokenizer files); `talker` adds the talker,
    its code predictor and code2wav (enable_audio_output)."""
    model, tokenizer = build_model(spec, seed, talker)
    folder = Path(folder)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    write_processor_config(folder, MEL_BINS, AUDIO_CHUNK_S, PATCH_SIZE, MAX_IMAGE_PIXELS, "Qwen3OmniMoeProcessor")
    return folder


def load_reference(folder: Path):
    from transformers import Qwen3OmniMoeForConditionalGeneration

    return Qwen3OmniMoeForConditionalGeneration.from_pretrained(folder, dtype=torch.float32).eval()
