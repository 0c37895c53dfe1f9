"""qwen3-omni-demo: Qwen3-Omni's thinker (the MoE text decoder) at a tiny size with seeded random weights.

One transformers-layout folder (config.json, model.safetensors with the thinker's tensors in the released
naming, one tensor per expert, tokenizer files with Qwen3-Omni's special tokens), written once into the user's
cache from our own modules and loaded through the same loader as real checkpoints. Chat runs offline in
seconds; the weights are random, so the words are noise by design.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from vidloom.core.card import ModelCard, RecipeSpec
from vidloom.demo.cache import DemoCheckpoint, noise_note, save_merged, write_json
from vidloom.demo.tokenizer import CHATML_TEMPLATE, train_chat_tokenizer
from vidloom.families.qwen3_omni.cards import AR_LOOP, ARCHITECTURE, qwen3_omni_card
from vidloom.families.qwen3_omni.config import Qwen3OmniConfig
from vidloom.families.qwen3_omni.decoder import THINKER_NAME_MAP, MoEDecoder
from vidloom.families.qwen3_omni.load import WEIGHTS_STEM

DEMO_ID = "qwen3-omni-demo"
DEMO_VERSION = 1  # bump when the demo's architecture or files change
DEMO_SEED = 20261206
DEMO_NOTE = noise_note(DEMO_ID, "Qwen3-Omni", "Qwen/Qwen3-Omni-30B-A3B-Instruct", layout="transformers")
CHAT_TEMPLATE = CHATML_TEMPLATE  # Qwen3-Omni's template renders text turns the same
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


def demo_card() -> ModelCard:
    card = qwen3_omni_card(DEMO_ID, f"demo:{DEMO_ID}", precision="float32", notes=(DEMO_NOTE,),
                           description="Qwen3-Omni thinker (MoE; chat, text out), tiny, random weights")
    return dataclasses.replace(card, recipe=RecipeSpec(method="random-init", loop=AR_LOOP))


def write_demo_checkpoint(folder: Path) -> None:
    tokenizer = train_chat_tokenizer(CORPUS, SPECIALS, CHAT_TEMPLATE)
    tokenizer.save_pretrained(str(folder))
    raw = {"architectures": [ARCHITECTURE], "model_type": "qwen3_omni_moe", "enable_audio_output": False,
           "thinker_config": {"text_config": {**THINKER, "vocab_size": len(tokenizer)}}}
    config = Qwen3OmniConfig.from_raw(raw)
    torch.manual_seed(DEMO_SEED)
    thinker = MoEDecoder(config.thinker)
    with torch.no_grad():  # unit-scale weights: greedy ids vary step by step and routers pick different experts
        for name, param in thinker.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            elif param.ndim >= 2:
                param.normal_(0.0, 1.0 if name.startswith(("embed", "head")) else param.shape[-1] ** -0.5)
            else:
                param.zero_()
    save_merged(folder, ((thinker, THINKER_NAME_MAP),), stem=WEIGHTS_STEM)
    write_json(folder / "config.json", raw)  # last: the folder's completeness marker


ensure_demo_checkpoint = DemoCheckpoint(DEMO_ID, DEMO_VERSION, write_demo_checkpoint, marker="config.json").ensure
