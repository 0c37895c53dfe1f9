"""Community LoRA key formats, rewritten to the diffusers/PEFT keys `files.read_lora_file` reads.

One converter per family, each accepting what diffusers' loader for that family accepts (the
`lora_state_dict` of its LoraLoaderMixin and the converters it calls in lora_conversion_utils): the
original repos' module names (LTX-2's `diffusion_model.` checkpoints), and more as families are added.
A file already in diffusers/PEFT keys passes through unchanged. A key no rule understands is refused
naming the file and the key, never dropped: an adapter that silently lost layers would run and look fine.
"""

from __future__ import annotations

from pathlib import Path

import torch

from vidloom.core.errors import CheckpointError

Tensors = dict[str, torch.Tensor]

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
_LTX2_ORIGINAL = "diffusion_model."
_LTX2_CONNECTORS = "text_embedding_projection."


def ltx2_keys(path: Path, tensors: Tensors) -> Tensors:
    """LTX-2 files as Lightricks writes them (`diffusion_model.<ltx-core name>`) -> `transformer.<diffusers name>`.

    Like diffusers' LTX2LoraLoaderMixin, a file with any `diffusion_model.` key is read as an original-format
    file. Adapters on the text connectors (`text_embedding_projection.`) are refused by name: our connectors run
    inside the prompt cache, so a per-request adapter there would need a cache keyed by adapter set.
    """
    for key in tensors:
        if key.startswith(_LTX2_CONNECTORS) or key.startswith("connectors."):
            raise CheckpointError(
                f"{path}: key {key!r} targets LTX-2's text connectors; adapters on the connectors are not "
                "supported yet (only the transformer's)"
            )
    if not any(key.startswith(_LTX2_ORIGINAL) for key in tensors):
        return tensors
    converted: Tensors = {}
    for key, tensor in tensors.items():
        if not key.startswith(_LTX2_ORIGINAL):
            raise CheckpointError(
                f"{path}: key {key!r} is not an LTX-2 '{_LTX2_ORIGINAL}<module>' key (the file's other keys are)"
            )
        segments = [_LTX2_SEGMENTS.get(s, s) for s in key[len(_LTX2_ORIGINAL):].split(".")]
        segments[0] = _LTX2_HEADS.get(segments[0], segments[0])
        converted["transformer." + ".".join(segments)] = tensor
    return converted
