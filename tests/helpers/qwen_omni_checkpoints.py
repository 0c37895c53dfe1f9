"""Tiny Qwen2.5-Omni checkpoints (random weights, offline tokenizer, a speaker table) for parity tests.

Written by transformers' `Qwen2_5OmniForConditionalGeneration.save_pretrained`, with `spk_dict.pt`
beside the weights in the released checkpoint's format ({voice: {"bos_token", "cond", "ref_mel"}}) and
the released voice names (Chelsie, Ethan). Two configurations differ in heads, layers and token2wav
sizes. Weights are rescaled so that greedy ids change from step to step and the talker's conditioning
(thinker hidden states) moves its codes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from vidloom.families.qwen_omni.demo import CHAT_TEMPLATE  # the demo's: the released template's rendering

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>",
            "<|vision_bos|>", "<|vision_eos|>", "<|IMAGE|>", "<|VIDEO|>", "<tts_pad>", "<tts_text_bos>",
            "<tts_text_eod>", "<tts_text_bos_single>", "<tts_text_bos_single_2>"]
CORPUS = [
    "the kite rose over the dunes and the wind sang",
    "tell me about kites in one sentence please",
    "hello world! the quick brown fox jumps over the lazy dog 1 2 3",
    "system user assistant you are a helpful assistant who speaks",
    "Qwen speaks with the voices of Chelsie and Ethan",
]
VOICES = ("Chelsie", "Ethan")  # the released checkpoint's spk_dict.pt voices
AUDIO_MEL_BINS = 16  # the audio tower's num_mel_bins = the feature extractor's feature_size
AUDIO_CHUNK_S = 4  # the feature extractor's chunk_length: the longest clip it takes, seconds
TOWER_GAIN = 8.0  # the towers' convolution weights, in units of 1/sqrt(fan_in)
TALKER_VOCAB = 48  # codec ids; the last four are pad, start, end, mask (8292..8296 in the real 8448-entry table)


@dataclass(frozen=True)
class TinyOmni:
    """One tiny Qwen2.5-Omni configuration."""

    name: str
    thinker: dict[str, Any]
    talker: dict[str, Any]
    dit: dict[str, Any]
    bigvgan: dict[str, Any]


# The DiT's speaker encoder (ECAPA-TDNN), the same tiny one in every config.
SPEAKER_ENCODER = dict(enc_dim=16, enc_channels=[16, 16, 16, 16, 48], enc_kernel_sizes=[5, 3, 3, 3, 1],
                       enc_dilations=[1, 2, 3, 4, 1], enc_attention_channels=8, enc_res2net_scale=2,
                       enc_se_channels=8)


def _mrope(theta: float, section: list[int]) -> dict[str, Any]:
    """Qwen2.5-Omni's multimodal RoPE: `section` splits each head's rotary pairs among time, height and width."""
    return {"rope_type": "default", "rope_theta": theta, "mrope_section": section}


OMNI_A = TinyOmni(
    name="omni-a",
    thinker=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, rope_parameters=_mrope(10000.0, [2, 1, 1])),
    talker=dict(hidden_size=24, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=1, head_dim=12, rope_parameters=_mrope(10000.0, [2, 2, 2])),
    dit=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, head_dim=16, ff_mult=2, emb_dim=16,
             block_size=4, look_ahead_layers=[1], look_backward_layers=[0], repeats=2, mel_dim=16,
             enc_emb_dim=16, **SPEAKER_ENCODER),
    bigvgan=dict(mel_dim=16, upsample_initial_channel=32, resblock_kernel_sizes=[3, 7],
                 resblock_dilation_sizes=[[1, 3, 5], [1, 3, 5]], upsample_rates=[4, 2], upsample_kernel_sizes=[8, 4]),
)
OMNI_B = TinyOmni(
    name="omni-b",
    thinker=dict(hidden_size=48, intermediate_size=96, num_hidden_layers=3, num_attention_heads=6,
                 num_key_value_heads=3, rope_parameters=_mrope(1000000.0, [2, 1, 1])),
    talker=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=2, head_dim=8, rope_parameters=_mrope(10000.0, [2, 1, 1])),
    dit=dict(hidden_size=48, num_hidden_layers=3, num_attention_heads=3, head_dim=16, ff_mult=2, emb_dim=24,
             block_size=6, look_ahead_layers=[2], look_backward_layers=[0, 1], repeats=2, mel_dim=20,
             enc_emb_dim=24, **SPEAKER_ENCODER),
    bigvgan=dict(mel_dim=20, upsample_initial_channel=24, resblock_kernel_sizes=[3, 5, 7],
                 resblock_dilation_sizes=[[1, 3, 5], [1, 3, 5], [1, 3, 5]], upsample_rates=[3, 2, 2],
                 upsample_kernel_sizes=[6, 4, 4]),
)
OMNI_CONFIGS = (OMNI_A, OMNI_B)


def train_tokenizer():
    """A byte-level BPE trained offline, saved as a Qwen2 tokenizer with Qwen2.5-Omni's special tokens."""
    from tests.helpers.flux2_checkpoints import train_qwen_tokenizer

    return train_qwen_tokenizer(tuple(SPECIALS), CORPUS, vocab_size=300, chat_template=CHAT_TEMPLATE)


def omni_config(spec: TinyOmni, tokenizer, enable_audio_output: bool = True):
    from transformers import Qwen2_5OmniConfig

    vocab = len(tokenizer)
    special = {name: tokenizer.convert_tokens_to_ids(name) for name in SPECIALS}
    thinker = dict(
        text_config=dict(vocab_size=vocab, **spec.thinker),
        audio_config=dict(num_mel_bins=AUDIO_MEL_BINS, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=16,
                          d_model=16, output_dim=spec.thinker["hidden_size"], n_window=4, max_source_positions=64),
        vision_config=dict(depth=1, hidden_size=16, intermediate_size=16, num_heads=2, out_hidden_size=spec.thinker[
            "hidden_size"], fullatt_block_indexes=[0], window_size=28, patch_size=14),
        audio_token_index=special["<|AUDIO|>"], image_token_index=special["<|IMAGE|>"],
        video_token_index=special["<|VIDEO|>"], audio_start_token_id=special["<|audio_bos|>"],
        audio_end_token_id=special["<|audio_eos|>"], vision_start_token_id=special["<|vision_bos|>"],
        vision_end_token_id=special["<|vision_eos|>"],
    )
    talker = dict(
        vocab_size=TALKER_VOCAB, embedding_size=spec.thinker["hidden_size"],
        tts_text_start_token_id=special["<tts_text_bos>"], tts_text_end_token_id=special["<tts_text_eod>"],
        tts_text_pad_token_id=special["<tts_pad>"], tts_codec_pad_token_id=TALKER_VOCAB - 4,
        tts_codec_start_token_id=TALKER_VOCAB - 3, tts_codec_end_token_id=TALKER_VOCAB - 2,
        tts_codec_mask_token_id=TALKER_VOCAB - 1, audio_token_index=special["<|AUDIO|>"],
        image_token_index=special["<|IMAGE|>"], video_token_index=special["<|VIDEO|>"],
        vision_start_token_id=special["<|vision_bos|>"], vision_end_token_id=special["<|vision_eos|>"],
        audio_start_token_id=special["<|audio_bos|>"], audio_end_token_id=special["<|audio_eos|>"], **spec.talker,
    )
    token2wav = dict(dit_config=dict(num_embeds=TALKER_VOCAB, **spec.dit), bigvgan_config=dict(spec.bigvgan))
    return Qwen2_5OmniConfig(thinker_config=thinker, talker_config=talker, token2wav_config=token2wav,
                             enable_audio_output=enable_audio_output)


def build_model(spec: TinyOmni, seed: int = 0, enable_audio_output: bool = True):
    """The transformers model with random weights, rescaled so that no path is inert."""
    from transformers import Qwen2_5OmniForConditionalGeneration

    tokenizer = train_tokenizer()
    torch.manual_seed(seed)
    model = Qwen2_5OmniForConditionalGeneration(omni_config(spec, tokenizer, enable_audio_output)).eval().float()
    g = torch.Generator().manual_seed(seed + 7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith("token2wav"):
                # Snake alpha/beta start at 0 and biases near it: perturb them so a misplaced one shows.
                if p.ndim == 1:
                    p.add_(0.1 * torch.randn(p.shape, generator=g))
                elif name.endswith("input_embed.proj.weight"):
                    p.mul_(6.0)  # louder conditioning: a wrong voice or code path moves the mel visibly
                elif name.endswith("conv_post.weight"):
                    p.mul_(30.0)  # a random vocoder whispers (std ~1e-3): make the waveform span [-1, 1]
                continue
            if not name.startswith(("thinker.model", "thinker.lm_head", "talker")):
                continue
            if "norm" in name:  # RMSNorm weights start at 1: a missing norm weight would go unnoticed
                p.add_(0.2 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name or "lm_head" in name or "codec_head" in name:
                p.mul_(0).add_(torch.randn(p.shape, generator=g))  # unit-scale logits: greedy ids differ per step
            elif p.ndim == 2:
                p.mul_(0).add_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)
            else:
                p.add_(0.05 * torch.randn(p.shape, generator=g))
        # The towers' convolutions (audio conv1/conv2, the vision patch embedding) loud: at init the towers'
        # outputs barely depend on their input (a sinusoid table and biases dominate). A generator of their own keeps every other tensor as before.
        towers = torch.Generator().manual_seed(seed + 13)
        for name, p in model.named_parameters():
            if ("audio_tower" in name or "visual" in name) and p.ndim >= 3:
                p.copy_(TOWER_GAIN * torch.randn(p.shape, generator=towers) / p[0].numel() ** 0.5)
    return model, tokenizer


def speakers(spec: TinyOmni, tokenizer, seed: int = 0) -> dict[str, dict[str, Any]]:
    """The speaker table: per voice the talker's text-start token, a DiT speaker embedding and a reference mel."""
    g = torch.Generator().manual_seed(seed + 11)
    mel_dim, enc_emb = spec.dit["mel_dim"], spec.dit["enc_emb_dim"]
    bos = [tokenizer.convert_tokens_to_ids("<tts_text_bos_single>"),
           tokenizer.convert_tokens_to_ids("<tts_text_bos_single_2>")]
    return {voice: {"bos_token": bos[i], "cond": 3 * torch.randn(1, enc_emb, generator=g),
                    "ref_mel": 3 * torch.randn(1, 24 + 6 * i, mel_dim, generator=g) - 4} for i, voice in enumerate(VOICES)}


def processors():
    """The checkpoint's feature extractor (Whisper log-mel at 16 kHz, the audio tower's mel bins) and Qwen2-VL
    image processor, at small sizes: a short chunk_length and few pixels per image."""
    from transformers import Qwen2VLImageProcessorPil, WhisperFeatureExtractor

    features = WhisperFeatureExtractor(feature_size=AUDIO_MEL_BINS, sampling_rate=16000, hop_length=160,
                                       chunk_length=AUDIO_CHUNK_S, n_fft=400)
    images = Qwen2VLImageProcessorPil(min_pixels=56 * 56, max_pixels=112 * 112, patch_size=14,
                                      temporal_patch_size=2, merge_size=2)
    return features, images


def write_processors(folder: Path) -> None:
    """One preprocessor_config.json holding both processors' settings, as the released checkpoint has it."""
    features, images = processors()
    raw = {**features.to_dict(), **images.to_dict(), "processor_class": "Qwen2_5OmniProcessor"}
    raw.pop("mel_filters", None)  # derived from the settings
    (Path(folder) / "preprocessor_config.json").write_text(json.dumps(raw, indent=2))


def write_tiny_omni(folder: Path, spec: TinyOmni = OMNI_A, seed: int = 0, enable_audio_output: bool = True,
                    encoders: bool = True) -> Path:
    """Save a tiny Qwen2.5-Omni folder: config.json, model.safetensors, tokenizer files, spk_dict.pt and
    preprocessor_config.json. `encoders` False drops the audio and vision towers' tensors (a text-only export)."""
    model, tokenizer = build_model(spec, seed, enable_audio_output)
    folder = Path(folder)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    write_processors(folder)
    if not encoders:
        _drop_towers(folder / "model.safetensors")
    if enable_audio_output:
        torch.save(speakers(spec, tokenizer, seed), folder / "spk_dict.pt")
    return folder


def _drop_towers(path: Path) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(path)
    kept = {k: v for k, v in tensors.items() if not k.startswith(("thinker.audio_tower.", "thinker.visual."))}
    save_file(kept, path, metadata={"format": "pt"})


def load_reference(folder: Path):
    """transformers' model from the folder (speaker table loaded), float32, eval."""
    from transformers import Qwen2_5OmniForConditionalGeneration

    model = Qwen2_5OmniForConditionalGeneration.from_pretrained(folder, torch_dtype=torch.float32).eval()
    return model
