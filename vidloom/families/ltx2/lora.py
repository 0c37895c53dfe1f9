"""LTX-2 LoRA files as Lightricks writes them, rewritten to diffusers/PEFT keys (diffusers' LTX2LoraLoaderMixin)."""

from __future__ import annotations

from pathlib import Path

from vidloom.core.errors import CheckpointError
from vidloom.lora.formats import ORIGINAL_PREFIX, Tensors


# LTX-2: Lightricks' checkpoints name the DiT's modules as their own repo does (ltx-core); the diffusers model
# renames some. Renames are whole dotted segments (the names below never occur inside another segment except as
# diffusers' substring rules also rename them: "audio_patchify_proj" -> "audio_proj_in").
_LTX2_SEGMENTS = {
    "patchify_proj": "proj_in",
    "audio_patchify_proj": "audio_proj_in",
    "av_ca_video_scale_shift_adaln_single": "av_cross_attn_video_scale_shift",
    "av_ca_a2v_gate_adaln_single": "av_cross_attn_video_a2v_gate",
    "av_ca_audio_scale_shift_adaln_single": "av_cross_attn_audio_scale_shift",
    "av_ca_v2a_gate_adaln_single": "av_cross_attn_audio_v2a_gate",
    "scale_shift_table_a2v_ca_video": "video_a2v_cross_attn_scale_shift_table",
    "scale_shift_table_a2v_ca_audio": "audio_a2v_cross_attn_scale_shift_table",
    "q_norm": "norm_q",
    "k_norm": "norm_k",
    "audio_prompt_adaln_single": "audio_prompt_adaln",  # LTX-2.3
    "prompt_adaln_single": "prompt_adaln",
}
# Only as the first segment (the top-level timestep embedders).
_LTX2_HEADS = {"adaln_single": "time_embed", "audio_adaln_single": "audio_time_embed"}
_LTX2_CONNECTORS = "text_embedding_projection."


def ltx2_keys(path: Path, tensors: Tensors) -> Tensors:
    """LTX-2 files as Lightricks writes them (`diffusion_model.<ltx-core name>` -> `transformer.<diffusers name>`,
    `text_embedding_projection.<name>` -> `connectors.<name>`, its `aggregate_embed` renamed `text_proj_in`).

    Like diffusers' LTX2LoraLoaderMixin, a file with any `diffusion_model.` or `text_embedding_projection.` key
    is read as an original-format file; diffusers/PEFT files (`transformer.` / `connectors.`) pass unchanged.
    """
    if not any(key.startswith((ORIGINAL_PREFIX, _LTX2_CONNECTORS)) for key in tensors):
        return tensors
    converted: Tensors = {}
    for key, tensor in tensors.items():
        if key.startswith(_LTX2_CONNECTORS):
            segments = ["text_proj_in" if s == "aggregate_embed" else s for s in key[len(_LTX2_CONNECTORS):].split(".")]
            converted["connectors." + ".".join(segments)] = tensor
            continue
        if not key.startswith(ORIGINAL_PREFIX):
            raise CheckpointError(
                f"{path}: key {key!r} is not an LTX-2 '{ORIGINAL_PREFIX}<module>' or '{_LTX2_CONNECTORS}<module>' key "
                "(the file's other keys are)"
            )
        segments = [_LTX2_SEGMENTS.get(s, s) for s in key[len(ORIGINAL_PREFIX):].split(".")]
        segments[0] = _LTX2_HEADS.get(segments[0], segments[0])
        converted["transformer." + ".".join(segments)] = tensor
    return converted
