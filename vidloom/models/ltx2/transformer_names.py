"""diffusers LTX2VideoTransformer3DModel key prefixes -> the LTX2Transformer's modules (LTX2_TRANSFORMER_NAME_MAP)."""

from __future__ import annotations

from vidloom.loading.name_map import NameMap


def _attention_rules(ckpt: str, ours: str) -> tuple[tuple[str, str], ...]:
    return ((f"{ckpt}.to_out.0", f"{ours}.out"), (f"{ckpt}.to_gate_logits", f"{ours}.gate"), (ckpt, ours))


def _time_rules(ckpt: str, ours: str) -> tuple[tuple[str, str], ...]:
    return ((f"{ckpt}.emb.timestep_embedder.linear_1", f"{ours}.up"),
            (f"{ckpt}.emb.timestep_embedder.linear_2", f"{ours}.down"), (f"{ckpt}.linear", f"{ours}.mod"))


_BLOCK = "transformer_blocks.{n}"
# diffusers LTX2VideoTransformer3DModel key prefixes -> ours.
LTX2_TRANSFORMER_NAME_MAP = NameMap((
    *_attention_rules(f"{_BLOCK}.attn1", "blocks.{n}.video_self"),
    *_attention_rules(f"{_BLOCK}.audio_attn1", "blocks.{n}.audio_self"),
    *_attention_rules(f"{_BLOCK}.attn2", "blocks.{n}.video_text"),
    *_attention_rules(f"{_BLOCK}.audio_attn2", "blocks.{n}.audio_text"),
    *_attention_rules(f"{_BLOCK}.audio_to_video_attn", "blocks.{n}.a2v"),
    *_attention_rules(f"{_BLOCK}.video_to_audio_attn", "blocks.{n}.v2a"),
    (f"{_BLOCK}.ff.net.0.proj", "blocks.{n}.video_ff.up"),
    (f"{_BLOCK}.ff.net.2", "blocks.{n}.video_ff.down"),
    (f"{_BLOCK}.audio_ff.net.0.proj", "blocks.{n}.audio_ff.up"),
    (f"{_BLOCK}.audio_ff.net.2", "blocks.{n}.audio_ff.down"),
    (f"{_BLOCK}.norm1", "blocks.{n}.video_norm_self"),
    (f"{_BLOCK}.norm2", "blocks.{n}.video_norm_text"),
    (f"{_BLOCK}.norm3", "blocks.{n}.video_norm_ff"),
    (f"{_BLOCK}.audio_norm1", "blocks.{n}.audio_norm_self"),
    (f"{_BLOCK}.audio_norm2", "blocks.{n}.audio_norm_text"),
    (f"{_BLOCK}.audio_norm3", "blocks.{n}.audio_norm_ff"),
    (f"{_BLOCK}.audio_to_video_norm", "blocks.{n}.video_norm_cross"),
    (f"{_BLOCK}.video_to_audio_norm", "blocks.{n}.audio_norm_cross"),
    (f"{_BLOCK}.scale_shift_table", "blocks.{n}.video_table"),
    (f"{_BLOCK}.audio_scale_shift_table", "blocks.{n}.audio_table"),
    (f"{_BLOCK}.prompt_scale_shift_table", "blocks.{n}.video_text_table"),
    (f"{_BLOCK}.audio_prompt_scale_shift_table", "blocks.{n}.audio_text_table"),
    (f"{_BLOCK}.video_a2v_cross_attn_scale_shift_table", "blocks.{n}.video_cross_table"),
    (f"{_BLOCK}.audio_a2v_cross_attn_scale_shift_table", "blocks.{n}.audio_cross_table"),
    ("proj_in", "video_in"),
    ("audio_proj_in", "audio_in"),
    ("caption_projection.linear_1", "video_caption.0"),
    ("caption_projection.linear_2", "video_caption.2"),
    ("audio_caption_projection.linear_1", "audio_caption.0"),
    ("audio_caption_projection.linear_2", "audio_caption.2"),
    *_time_rules("time_embed", "video_time"),
    *_time_rules("audio_time_embed", "audio_time"),
    *_time_rules("av_cross_attn_video_scale_shift", "video_cross_time"),
    *_time_rules("av_cross_attn_audio_scale_shift", "audio_cross_time"),
    *_time_rules("av_cross_attn_video_a2v_gate", "video_cross_gate_time"),
    *_time_rules("av_cross_attn_audio_v2a_gate", "audio_cross_gate_time"),
    *_time_rules("prompt_adaln", "video_text_time"),
    *_time_rules("audio_prompt_adaln", "audio_text_time"),
    ("scale_shift_table", "video_out_table"),
    ("audio_scale_shift_table", "audio_out_table"),
    ("proj_out", "video_out"),
    ("audio_proj_out", "audio_out"),
))
