"""qwen-omni-demo: the Qwen2.5-Omni architecture at a tiny size with seeded random weights and the real voices.

One transformers-layout folder (config.json, model.safetensors, tokenizer files, spk_dict.pt with the
released checkpoint's voice names Chelsie and Ethan, preprocessor_config.json for the audio and vision
towers: demo_encoders), written once into the user's cache from our own
modules and loaded through the same loader as real checkpoints. Chat (with audio and image parts too)
and speech run offline in seconds; the weights are random, so the words and the sound are noise by design.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from vidloom.core.card import ModelCard, RecipeSpec
from vidloom.families.qwen_omni.config import OmniConfig
from vidloom.families.qwen_omni.decoder import TALKER_NAME_MAP, THINKER_NAME_MAP, OmniDecoder
from vidloom.families.qwen_omni.dit import DIT_NAME_MAP, CodeToMelDiT
from vidloom.families.qwen_omni.speakers import SPEAKER_FILE
from vidloom.families.qwen_omni.vocoder import VOCODER_NAME_MAP, BigVGAN
from vidloom.demo.cache import DemoCheckpoint, fill_zeros, noise_note, save_merged, write_json
from vidloom.demo.tokenizer import train_chat_tokenizer
from vidloom.families.qwen_omni.cards import AR_LOOP, ARCHITECTURE, omni_card
from vidloom.families.qwen_omni.demo_encoders import (MEDIA_SPECIALS, thinker_media_config, tower_parts,
                                                     write_processors)
from vidloom.families.qwen_omni.load import WEIGHTS_STEM

DEMO_ID = "qwen-omni-demo"
DEMO_VERSION = 2  # bump when the demo's architecture or files change
DEMO_SEED = 20260325
DEMO_NOTE = noise_note(DEMO_ID, "Qwen2.5-Omni", "Qwen/Qwen2.5-Omni-3B", layout="transformers")
VOICES = ("Chelsie", "Ethan")  # the released checkpoint's spk_dict.pt voices
CHAT_TEMPLATE = (
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n"
    "{%- if m.content is string %}{{ m.content }}{% else %}"
    "{%- for p in m.content %}{% if p.type == 'text' %}{{ p.text }}"
    "{% elif p.type == 'audio' %}<|audio_bos|><|AUDIO|><|audio_eos|>"
    "{% elif p.type == 'image' %}<|vision_bos|><|IMAGE|><|vision_eos|>{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>",
            "<tts_text_bos_single>", "<tts_text_bos_single_2>") + MEDIA_SPECIALS
CORPUS = ("the kite rose over the dunes and the wind sang", "tell me about kites in one sentence please",
          "hello world! the quick brown fox jumps over the lazy dog", "you are a helpful assistant who speaks",
          "Qwen speaks with the voices of Chelsie and Ethan")
CODEC_VOCAB = 64  # the last four: pad, start, end, mask (8292..8296 of the real 8448)
THINKER = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, rms_norm_eps=1e-6,
               rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [2, 1, 1]})
TALKER = dict(hidden_size=24, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
              num_key_value_heads=1, head_dim=12, rms_norm_eps=1e-6, embedding_size=32, vocab_size=CODEC_VOCAB,
              rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [2, 2, 2]})
DIT = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, head_dim=16, ff_mult=2, emb_dim=16,
           block_size=24, look_ahead_layers=[1], look_backward_layers=[0], repeats=2, mel_dim=80,
           num_embeds=CODEC_VOCAB, enc_emb_dim=16, enc_dim=16, enc_channels=[16, 16, 16, 16, 48],
           enc_kernel_sizes=[5, 3, 3, 3, 1], enc_dilations=[1, 2, 3, 4, 1], enc_attention_channels=8,
           enc_res2net_scale=2, enc_se_channels=8)
# The released vocoder's rates (240 samples per mel frame, 24 kHz), narrow.
BIGVGAN = dict(mel_dim=80, upsample_initial_channel=64, resblock_kernel_sizes=[3, 7],
               resblock_dilation_sizes=[[1, 3, 5], [1, 3, 5]], upsample_rates=[5, 3, 2, 2, 2, 2],
               upsample_kernel_sizes=[11, 7, 4, 4, 4, 4])


def demo_card() -> ModelCard:
    card = omni_card(DEMO_ID, f"demo:{DEMO_ID}", speaks=True, precision="float32",
                     description="Qwen2.5-Omni (chat with audio and images, speech; voices Chelsie, Ethan), tiny, "
                                 "random weights", notes=(DEMO_NOTE,))
    return dataclasses.replace(card, recipe=RecipeSpec(method="random-init", loop=AR_LOOP))


def write_demo_checkpoint(folder: Path) -> None:
    tokenizer = train_chat_tokenizer(CORPUS, SPECIALS, CHAT_TEMPLATE)
    tokenizer.save_pretrained(str(folder))
    ids = {name: tokenizer.convert_tokens_to_ids(name) for name in SPECIALS}
    raw = {
        "architectures": [ARCHITECTURE], "model_type": "qwen2_5_omni", "enable_audio_output": True,
        "thinker_config": {"text_config": {**THINKER, "vocab_size": len(tokenizer)},
                           **thinker_media_config(THINKER["hidden_size"], ids)},
        "talker_config": {**TALKER, "tts_codec_pad_token_id": CODEC_VOCAB - 4,
                          "tts_codec_start_token_id": CODEC_VOCAB - 3, "tts_codec_end_token_id": CODEC_VOCAB - 2,
                          "tts_codec_mask_token_id": CODEC_VOCAB - 1, "tts_text_start_token_id": ids["<tts_text_bos>"],
                          "tts_text_end_token_id": ids["<tts_text_eod>"], "tts_text_pad_token_id": ids["<tts_pad>"]},
        "token2wav_config": {"dit_config": DIT, "bigvgan_config": BIGVGAN},
    }
    config = OmniConfig.from_raw(raw)
    torch.manual_seed(DEMO_SEED)
    thinker = OmniDecoder(config.thinker)
    talker = OmniDecoder(config.talker, projects_input=True)
    dit, vocoder = CodeToMelDiT(config.dit), BigVGAN(config.vocoder)
    with torch.no_grad():  # unit-scale embeddings and heads: greedy ids vary step by step instead of repeating
        for module in (thinker, talker):
            module.embed.weight.normal_(0.0, 1.0)
            module.head.weight.normal_(0.0, 1.0 / module.config.hidden_size ** 0.5 * 4)
        vocoder.conv_post.weight.mul_(30.0)  # a random vocoder whispers: make the noise audible
    for module in (thinker, talker, dit, vocoder):
        fill_zeros(module, std=0.1)
    towers = tower_parts(raw["thinker_config"], DEMO_SEED + 2)
    save_merged(folder, ((thinker, THINKER_NAME_MAP), (talker, TALKER_NAME_MAP), (dit, DIT_NAME_MAP),
                         (vocoder, VOCODER_NAME_MAP), *towers), stem=WEIGHTS_STEM)
    write_processors(folder)
    g = torch.Generator().manual_seed(DEMO_SEED + 1)
    speakers = {voice: {"bos_token": ids[f"<tts_text_bos_single{'' if i == 0 else '_2'}>"],
                        "cond": 3 * torch.randn(1, DIT["enc_emb_dim"], generator=g),
                        "ref_mel": 3 * torch.randn(1, 48, DIT["mel_dim"], generator=g) - 4}
                for i, voice in enumerate(VOICES)}
    torch.save(speakers, folder / SPEAKER_FILE)
    write_json(folder / "config.json", raw)  # last: the folder's completeness marker


ensure_demo_checkpoint = DemoCheckpoint(DEMO_ID, DEMO_VERSION, write_demo_checkpoint, marker="config.json").ensure
