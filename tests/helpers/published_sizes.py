"""The size keys of each published config class and their tiny values (tests/helpers/published.py scales with it).

A table entry is one of: a value (replaces the published one), a callable (published value, whole config) -> value
(for sizes whose length or meaning depends on the file, e.g. per-stage channel lists), a `Vocab(n)` (the tiny
tokenizer's length plus n), or a dict (a nested config, scaled by the same rules). A key is only replaced where
the published file has it with a non-null value; every other key stays exactly as published. The tiny sizes agree
across one repo's components (text width = the encoder's hidden size, image width = the CLIP tower's, ...).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Vocab:
    """The tiny tokenizer's length plus `extra` (rows past it: special image tokens, padded embeddings)."""

    extra: int = 0


@dataclass(frozen=True)
class Token:
    """The tiny tokenizer's id of a token (the published id is the real tokenizer's)."""

    text: str


def _first(n: int):
    return lambda value, config: value[:n]  # the published per-layer pattern, cut to the tiny layer count


def _divided(factor: int):
    return lambda value, config: [max(1, c // factor) for c in value]  # per-stage widths, ratios kept


def _ones(value: Any, config: dict[str, Any]) -> list[int]:
    return [1] * len(value)


CLIP_SIDE = 32  # tiny CLIP input side; patch 8 -> 16 patches + CLS = 17 tokens
TEXT = 16  # hidden size of the tiny decoder-only text encoders (Qwen3, Gemma)
_QWEN3_LAYERS = 28  # FLUX.2-klein reads Qwen3 hidden states 9, 18 and 27
_GEMMA_LAYERS = 2
_SIGLIP_SIDE = 54  # patch 2 -> 27 x 27 = 729 image tokens, the count HunyuanVideo-1.5's pipelines hard-code

# --- Qwen2.5-Omni (a transformers folder): thinker 32 wide (4 heads of 8), talker 24 (2 heads of 12), towers 16;
# special-token ids become the tiny tokenizer's, the talker's codec ids the last four of a 48-entry table ---
OMNI_CODECS = 48
OMNI_MEL_BINS = 16  # the audio tower's mel bins = the tiny feature extractor's feature_size
_OMNI_IDS = dict(audio_token_index=Token("<|AUDIO|>"), image_token_index=Token("<|IMAGE|>"),
                 video_token_index=Token("<|VIDEO|>"), audio_start_token_id=Token("<|audio_bos|>"),
                 audio_end_token_id=Token("<|audio_eos|>"), vision_start_token_id=Token("<|vision_bos|>"),
                 vision_end_token_id=Token("<|vision_eos|>"), user_token_id=Token("user"))
_OMNI_THINKER = dict(
    _OMNI_IDS,
    text_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, max_window_layers=2, layer_types=_first(2), vocab_size=Vocab(),
                     rope_parameters=dict(mrope_section=[2, 1, 1])),
    audio_config=dict(d_model=16, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=16,
                      num_mel_bins=OMNI_MEL_BINS, output_dim=32, n_window=4, max_source_positions=64),
    vision_config=dict(depth=1, hidden_size=16, intermediate_size=16, num_heads=2, out_hidden_size=32,
                       fullatt_block_indexes=[0], window_size=28))
_OMNI_TALKER = dict(
    _OMNI_IDS, hidden_size=24, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
    num_key_value_heads=1, head_dim=12, max_window_layers=2, layer_types=_first(2), embedding_size=32,
    vocab_size=OMNI_CODECS, rope_parameters=dict(mrope_section=[2, 2, 2]),
    tts_text_start_token_id=Token("<tts_text_bos>"), tts_text_end_token_id=Token("<tts_text_eod>"),
    tts_text_pad_token_id=Token("<tts_pad>"), tts_codec_pad_token_id=OMNI_CODECS - 4,
    tts_codec_start_token_id=OMNI_CODECS - 3, tts_codec_end_token_id=OMNI_CODECS - 2,
    tts_codec_mask_token_id=OMNI_CODECS - 1)

# --- Qwen3-Omni (a transformers folder): thinker MoE 32 wide (4 heads of 16, 4 experts top-2), talker MoE 24 (2 heads
# of 12, 6 experts top-2 + shared), code predictor 24, code2wav 32, towers 16. The codec keeps the released layout:
# codebook = talker vocab - 1024 (the suppressed top ids), special codec ids the same offsets past the codebook ---
Q3_CODEBOOK = 64
Q3_GROUPS = 4
_Q3_LAYERS = 2


def _codec_id(value: int, config: dict[str, Any]) -> int:
    return value - 2048 + Q3_CODEBOOK  # the released codebook is 2048 codes; its special ids follow it


_Q3_IDS = dict(audio_token_id=Token("<|audio_pad|>"), image_token_id=Token("<|image_pad|>"),
               video_token_id=Token("<|video_pad|>"), audio_start_token_id=Token("<|audio_start|>"),
               audio_end_token_id=Token("<|audio_end|>"), vision_start_token_id=Token("<|vision_start|>"),
               vision_end_token_id=Token("<|vision_end|>"))
_Q3_THINKER = dict(
    _Q3_IDS, user_token_id=Token("user"),
    text_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=_Q3_LAYERS, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                     vocab_size=Vocab(), rope_parameters=dict(mrope_section=[4, 2, 2])),
    audio_config=dict(d_model=16, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=16,
                      num_mel_bins=OMNI_MEL_BINS, output_dim=32, downsample_hidden_size=8),
    vision_config=dict(depth=1, hidden_size=16, intermediate_size=16, num_heads=2, out_hidden_size=32,
                       deepstack_visual_indexes=[0]))
_Q3_TALKER = dict(
    _Q3_IDS, accept_hidden_layer=1, thinker_hidden_size=32, num_code_groups=Q3_GROUPS,
    codec_bos_id=_codec_id, codec_eos_token_id=_codec_id, codec_nothink_id=_codec_id, codec_pad_id=_codec_id,
    codec_think_bos_id=_codec_id, codec_think_eos_id=_codec_id,
    speaker_id=lambda v, c: {name: _codec_id(i, c) for name, i in v.items()},
    text_config=dict(hidden_size=24, intermediate_size=40, num_hidden_layers=_Q3_LAYERS, num_attention_heads=2,
                     num_key_value_heads=1, head_dim=12, num_local_experts=6, num_experts=6, num_experts_per_tok=2,
                     moe_intermediate_size=8, shared_expert_intermediate_size=20, vocab_size=Q3_CODEBOOK + 1024,
                     rope_parameters=dict(mrope_section=[2, 2, 2])),
    code_predictor_config=dict(hidden_size=24, intermediate_size=24, num_hidden_layers=1, num_attention_heads=2,
                               num_key_value_heads=1, head_dim=8, layer_types=_first(1), max_window_layers=1,
                               num_code_groups=Q3_GROUPS, vocab_size=Q3_CODEBOOK))
_Q3_CODE2WAV = dict(codebook_size=Q3_CODEBOOK, num_quantizers=Q3_GROUPS, hidden_size=32, num_hidden_layers=1,
                    num_attention_heads=4, num_key_value_heads=4, intermediate_size=48, decoder_dim=64,
                    sliding_window=16, codebook_dim=16, vector_quantization_hidden_dimension=16)

SIZES: dict[str, dict[str, Any]] = {
    # --- Wan2.1 / 2.2 / FastWan ---
    "WanTransformer3DModel": dict(num_attention_heads=2, attention_head_dim=12, ffn_dim=32, num_layers=2,
                                  text_dim=32, freq_dim=16, image_dim=24, added_kv_proj_dim=24,
                                  pos_embed_seq_len=2 * ((CLIP_SIDE // 8) ** 2 + 1)),
    "AnyFlowFARTransformer3DModel": dict(num_attention_heads=2, attention_head_dim=12, ffn_dim=32, num_layers=2,
                                         text_dim=32, freq_dim=16),
    # Helios: Wan2.1-14B shape + history patches -> 2 heads x 12 (rope [4, 4, 4]).
    "HeliosTransformer3DModel": dict(num_attention_heads=2, attention_head_dim=12, ffn_dim=32, num_layers=2,
                                     text_dim=32, freq_dim=16, rope_dim=[4, 4, 4]),
    "AutoencoderKLWan": dict(base_dim=8, decoder_base_dim=12, num_res_blocks=1),
    "UMT5EncoderModel": dict(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, vocab_size=Vocab(),
                             relative_attention_num_buckets=8, relative_attention_max_distance=32),
    # --- HunyuanVideo-1.5: 2 heads x 16 (rope [4, 6, 6]); Qwen2.5-VL text TEXT wide, 3 layers (it reads
    # hidden_states[-3]); ByT5 as T5EncoderModel above (32 wide); SigLIP keeps its 1152 width (image_embed_dim: the
    # pipelines build 729 x 1152 zeros for text to video) ---
    "HunyuanVideo15Transformer3DModel": dict(num_attention_heads=2, attention_head_dim=16, num_layers=2,
                                             num_refiner_layers=1, text_embed_dim=TEXT, text_embed_2_dim=32,
                                             rope_axes_dim=[4, 6, 6],
                                             target_size=lambda v, c: v // 10),  # sets the size: 640 -> 64 px
    # The encoder's last width must be >= 2 x latent_channels (its channel-group shortcut); GroupNorm needs >= 32.
    "AutoencoderKLHunyuanVideo15": dict(block_out_channels=lambda v, c: [max(32, x // 16) for x in v],
                                        layers_per_block=1),
    "Qwen2_5_VLTextModel": dict(hidden_size=TEXT, intermediate_size=2 * TEXT, num_hidden_layers=3,
                                num_attention_heads=2, num_key_value_heads=1, max_window_layers=3,
                                layer_types=_first(3), vocab_size=Vocab(),
                                rope_parameters=dict(mrope_section=[2, 1, 1])),
    "SiglipVisionModel": dict(intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                              image_size=_SIGLIP_SIDE, patch_size=2),
    "SiglipImageProcessor": dict(size={"height": _SIGLIP_SIDE, "width": _SIGLIP_SIDE}),
    "CLIPVisionModelWithProjection": dict(hidden_size=24, intermediate_size=48, num_hidden_layers=3,
                                          num_attention_heads=2, image_size=CLIP_SIDE, patch_size=8,
                                          projection_dim=16),
    "CLIPImageProcessor": dict(size={"shortest_edge": CLIP_SIDE}, crop_size={"height": CLIP_SIDE,
                                                                             "width": CLIP_SIDE}),
    # --- FLUX.2-klein ---
    "Flux2Transformer2DModel": dict(num_layers=1, num_single_layers=2, attention_head_dim=16, num_attention_heads=2,
                                    joint_attention_dim=3 * TEXT, timestep_guidance_channels=32,
                                    axes_dims_rope=[4, 4, 4, 4]),
    "AutoencoderKLFlux2": dict(block_out_channels=[8, 8, 16, 16], layers_per_block=1, norm_num_groups=4),
    "Qwen3ForCausalLM": dict(hidden_size=TEXT, intermediate_size=2 * TEXT, num_attention_heads=2,
                             num_key_value_heads=1, head_dim=8, num_hidden_layers=_QWEN3_LAYERS,
                             layer_types=_first(_QWEN3_LAYERS), vocab_size=Vocab()),
    # --- Cosmos3 (rope_axes_dim sums to head_dim / 2; rope_scaling.mrope_section restates it) ---
    "Cosmos3OmniTransformer": dict(hidden_size=32, head_dim=8, num_attention_heads=4, num_key_value_heads=2,
                                   intermediate_size=64, num_hidden_layers=2, rope_axes_dim=[2, 1, 1],
                                   rope_scaling={"mrope_section": [2, 1, 1]}, vocab_size=Vocab(37)),
    # --- LTX-2 / 2.3: video inner 2 x 8 = 16, audio inner 2 x 4 = 8, Gemma hidden 16 (= caption channels) ---
    "LTX2VideoTransformer3DModel": dict(num_attention_heads=2, attention_head_dim=8, cross_attention_dim=16,
                                        audio_num_attention_heads=2, audio_attention_head_dim=4,
                                        audio_cross_attention_dim=8, num_layers=2, caption_channels=TEXT),
    # 2.0's connectors both output the caption width; 2.3's (per_modality_projections) the video / audio widths.
    "LTX2TextConnectors": dict(
        caption_channels=TEXT, text_proj_in_factor=_GEMMA_LAYERS + 1, video_connector_num_attention_heads=2,
        video_connector_attention_head_dim=8, video_connector_num_layers=1, audio_connector_num_attention_heads=2,
        audio_connector_attention_head_dim=lambda v, c: 4 if c.get("per_modality_projections") else 8,
        audio_connector_num_layers=1, video_hidden_dim=16, audio_hidden_dim=8),
    "AutoencoderKLLTX2Video": dict(block_out_channels=_divided(32), decoder_block_out_channels=_divided(32),
                                   layers_per_block=_ones, decoder_layers_per_block=_ones),
    # base_channels stays: the latent statistics have base_channels entries = latent_channels x mel_bins / 4.
    "AutoencoderKLLTX2Audio": dict(num_res_blocks=1),
    # Upsampling stage s has hidden_channels / 2**(s+1) channels: 64 keeps 2.3's six stages at >= 1. One
    # residual stack per stage instead of three (the kernel-size and dilation lists run in parallel).
    "LTX2Vocoder": dict(hidden_channels=64, resnet_kernel_sizes=_first(1), resnet_dilations=_first(1)),
    "LTX2VocoderWithBWE": dict(hidden_channels=64, bwe_hidden_channels=32, resnet_kernel_sizes=_first(1),
                               resnet_dilations=_first(1), bwe_resnet_kernel_sizes=_first(1),
                               bwe_resnet_dilations=_first(1)),
    # Gemma's tokenizer ids: text rows = tokenizer + image, begin- and end-of-image tokens.
    "Gemma3ForConditionalGeneration": dict(
        text_config=dict(hidden_size=TEXT, intermediate_size=2 * TEXT, num_hidden_layers=_GEMMA_LAYERS,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=8, sliding_window=8,
                         layer_types=_first(_GEMMA_LAYERS), query_pre_attn_scalar=8, vocab_size=Vocab(3)),
        vision_config=dict(hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
                           image_size=16, patch_size=8),
        mm_tokens_per_image=4, image_token_index=Vocab(2), boi_token_index=Vocab(1), eoi_token_index=Vocab(0)),
    # --- SANA-WM stage 1: hidden 2 x 32 (linear_head_dim), Gemma-2 hidden 16 (= caption channels) ---
    "SanaWMTransformer3DModel": dict(num_layers=2, hidden_size=64, num_attention_heads=2, linear_head_dim=32,
                                     softmax_every_n=2, caption_channels=TEXT),
    "Gemma2ForCausalLM": dict(hidden_size=TEXT, intermediate_size=2 * TEXT, num_hidden_layers=_GEMMA_LAYERS,
                              num_attention_heads=2, num_key_value_heads=1, head_dim=8, query_pre_attn_scalar=8,
                              sliding_window=64, layer_types=_first(_GEMMA_LAYERS), vocab_size=Vocab(3)),
    # --- Stable Audio Open: DiT inner 4 x 8, projected text width 24, global = start + total seconds (2 x 24);
    # 4 latent channels, so the VAE encoder's output (mean and scale) is 8 wide ---
    # sample_size is the latent window every clip is generated in (then cut): 32 latents = 1.49 s at 44.1 kHz.
    "StableAudioDiTModel": dict(sample_size=32, in_channels=4, out_channels=4, num_layers=2, attention_head_dim=8, num_attention_heads=4,
                                num_key_value_attention_heads=2, cross_attention_dim=16, time_proj_dim=16,
                                global_states_input_dim=48, cross_attention_input_dim=24),
    "StableAudioProjectionModel": dict(text_encoder_dim=32, conditioning_dim=24),
    "AutoencoderOobleck": dict(encoder_hidden_size=8, decoder_input_channels=4, decoder_channels=4),
    "T5EncoderModel": dict(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, vocab_size=Vocab(),
                           relative_attention_num_buckets=8, relative_attention_max_distance=32),
    # --- Qwen-Image / -Edit: joint width 2 x 16 over Qwen2.5-VL's 16-wide text (4 heads of 8 -> mrope [2, 1, 1]);
    # the 16-channel VAE stays (its latent statistics have 16 entries); the edit processor sees <= 16 x 28^2 px ---
    "QwenImageTransformer2DModel": dict(num_layers=2, attention_head_dim=16, num_attention_heads=2,
                                        joint_attention_dim=TEXT, axes_dims_rope=[8, 4, 4]),
    "AutoencoderKLQwenImage": dict(base_dim=8, num_res_blocks=1),
    "Qwen2_5_VLForConditionalGeneration": dict(
        hidden_size=TEXT, intermediate_size=2 * TEXT, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_window_layers=2, vocab_size=Vocab(), rope_scaling=dict(mrope_section=[2, 1, 1]),
        bos_token_id=Token("<|endoftext|>"), eos_token_id=Token("<|im_end|>"), image_token_id=Token("<|image_pad|>"),
        video_token_id=Token("<|video_pad|>"), vision_start_token_id=Token("<|vision_start|>"),
        vision_end_token_id=Token("<|vision_end|>"), vision_token_id=Token("<|image_pad|>"),
        vision_config=dict(depth=1, hidden_size=16, intermediate_size=16, num_heads=2, out_hidden_size=TEXT,
                           fullatt_block_indexes=[0])),
    "Qwen2VLImageProcessorFast": dict(max_pixels=16 * 28 * 28, size={"longest_edge": 16 * 28 * 28,
                                                                     "shortest_edge": 3136}),
    "Qwen2_5OmniModel": dict(thinker_config=_OMNI_THINKER, talker_config=_OMNI_TALKER, token2wav_config=dict(
        dit_config=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, head_dim=16, emb_dim=16,
                        block_size=4, look_ahead_layers=[1], look_backward_layers=[0], mel_dim=16, enc_emb_dim=16,
                        enc_dim=16, enc_channels=[16, 16, 16, 16, 48], enc_attention_channels=8, enc_se_channels=8,
                        num_embeds=OMNI_CODECS),
        # Upsampling stage s has upsample_initial_channel / 2**(s+1) channels: 64 keeps the six stages at >= 1.
        bigvgan_config=dict(mel_dim=16, upsample_initial_channel=64))),
    "Qwen3OmniMoeForConditionalGeneration": dict(
        thinker_config=_Q3_THINKER, talker_config=_Q3_TALKER, code2wav_config=_Q3_CODE2WAV,
        user_token_id=Token("user"), assistant_token_id=Token("assistant"), system_token_id=Token("system"),
        im_start_token_id=Token("<|im_start|>"), im_end_token_id=Token("<|im_end|>"), tts_pad_token_id=Token("<tts_pad>"),
        tts_bos_token_id=Token("<tts_text_bos>"), tts_eos_token_id=Token("<tts_text_eod>")),
}


def scaled(config: dict[str, Any], class_name: str, tokenizer: Any = None,
           sizes: dict[str, Any] | None = None) -> dict[str, Any]:
    """`config` with the size keys of `class_name` (or the nested table `sizes`) replaced."""
    table = SIZES.get(class_name, {}) if sizes is None else sizes
    return {key: _tiny(value, table[key], config, tokenizer) if key in table and value is not None else value
            for key, value in config.items()}


def _tiny(value: Any, rule: Any, config: dict[str, Any], tokenizer: Any) -> Any:
    if isinstance(rule, (Vocab, Token)) and tokenizer is None:
        raise ValueError("a vocabulary or token rule needs the repo's tokenizer")
    if isinstance(rule, Vocab):
        return len(tokenizer) + rule.extra
    if isinstance(rule, Token):  # a special token, else the first piece of the word (Qwen's "user")
        token_id = tokenizer.convert_tokens_to_ids(rule.text)
        return token_id if token_id is not None else tokenizer.encode(rule.text, add_special_tokens=False)[0]
    if isinstance(rule, dict) and isinstance(value, dict):
        return scaled(value, "", tokenizer, rule)
    return rule(value, config) if callable(rule) else rule
