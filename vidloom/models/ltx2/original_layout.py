"""The Lightricks original key layout of the LTX-2 transformer, as in the official single `.safetensors`, as data.

That file holds the whole model: the transformer under `model.diffusion_model.` (with the text connectors, which
diffusers keeps as their own component), the VAEs under `vae.` / `audio_vae.` and the vocoder. A transformer override
reads the first prefix only. Names were read off diffusers 0.42.1's `convert_ltx2_transformer_to_diffusers`, the
reference our parity test loads the same file with; the table is ours (credited in NOTICE).
"""

from __future__ import annotations

import dataclasses

from vidloom.loading.key_layout import KeyLayout
from vidloom.loading.name_map import NameMap

LTX2_ORIGINAL = KeyLayout(
    name="Lightricks original layout",
    markers=("av_ca_a2v_gate_adaln_single.emb.timestep_embedder.linear_1.weight",
             "adaln_single.emb.timestep_embedder.linear_1.weight"),
    prefixes=("model.diffusion_model.",),
    only_prefixed=True,
    dropped=("video_embeddings_connector", "audio_embeddings_connector"),  # diffusers' `connectors` component
    renames=NameMap((
        ("patchify_proj", "proj_in"),
        ("audio_patchify_proj", "audio_proj_in"),
        ("adaln_single", "time_embed"),
        ("audio_adaln_single", "audio_time_embed"),
        ("av_ca_video_scale_shift_adaln_single", "av_cross_attn_video_scale_shift"),
        ("av_ca_a2v_gate_adaln_single", "av_cross_attn_video_a2v_gate"),
        ("av_ca_audio_scale_shift_adaln_single", "av_cross_attn_audio_scale_shift"),
        ("av_ca_v2a_gate_adaln_single", "av_cross_attn_audio_v2a_gate"),
        ("transformer_blocks.{n}.scale_shift_table_a2v_ca_video",
         "transformer_blocks.{n}.video_a2v_cross_attn_scale_shift_table"),
        ("transformer_blocks.{n}.scale_shift_table_a2v_ca_audio",
         "transformer_blocks.{n}.audio_a2v_cross_attn_scale_shift_table"),
    )),
    segments=(("q_norm", "norm_q"), ("k_norm", "norm_k")),
)
# The transformer alone with the wrapper stripped: how GGUF quantizations of it are published (ComfyUI-GGUF's
# converter drops `model.diffusion_model.`; diffusers' converter reads both spellings).
LTX2_ORIGINAL_BARE = dataclasses.replace(LTX2_ORIGINAL, name="Lightricks original layout (transformer only)",
                                         prefixes=(), only_prefixed=False)
LTX2_TRANSFORMER_LAYOUTS = (LTX2_ORIGINAL, LTX2_ORIGINAL_BARE)
