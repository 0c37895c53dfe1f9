"""The Lightricks original key layouts of the LTX-2 transformer and video VAE, as in the official single
`.safetensors`, as data.

That file holds the whole model: the transformer under `model.diffusion_model.` (with the text connectors, which
diffusers keeps as their own component), the VAEs under `vae.` / `audio_vae.` and the vocoder. Each override reads
its own prefix only, so the same file may be given for `transformer` and `vae`. Names were read off diffusers
0.42.1's `convert_ltx2_transformer_to_diffusers` and `convert_ltx2_vae_to_diffusers`, the references our parity tests
load the same file with; the tables are ours (credited in NOTICE).
"""

from __future__ import annotations

import dataclasses

from vidloom.loading.key_layout import KeyLayout
from vidloom.loading.name_map import NameMap
from vidloom.models.ltx2.video_vae import LTX2VideoVAEConfig

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


def ltx2_vae_layouts(config: LTX2VideoVAEConfig) -> tuple[KeyLayout, ...]:
    """The original layout of an LTX-2 video VAE of this shape, where every stage rescales (the released VAE).

    The original keeps each side's stages in one flat list: the encoder's stage blocks with a downsampler after
    each, then the mid block; the decoder's mid block first, then an upsampler before each stage block. diffusers
    nests the samplers in their stage, so the flat index comes from the config. A VAE with a stage that does not
    rescale has no fixed flat layout to read; it is read in the diffusers layout only.
    """
    if not (all(config.spatio_temporal_scaling) and all(config.decoder_spatio_temporal_scaling)):
        return ()
    encoder_stages, decoder_stages = len(config.block_out_channels), len(config.decoder_block_out_channels)
    rules = [("per_channel_statistics.mean-of-means", "latents_mean"),
             ("per_channel_statistics.std-of-means", "latents_std"),
             (f"encoder.down_blocks.{2 * encoder_stages}", "encoder.mid_block"),
             ("decoder.up_blocks.0", "decoder.mid_block")]
    for stage in range(encoder_stages):
        rules += [(f"encoder.down_blocks.{2 * stage}", f"encoder.down_blocks.{stage}"),
                  (f"encoder.down_blocks.{2 * stage + 1}", f"encoder.down_blocks.{stage}.downsamplers.0")]
    for stage in range(decoder_stages):
        rules += [(f"decoder.up_blocks.{2 * stage + 1}", f"decoder.up_blocks.{stage}.upsamplers.0"),
                  (f"decoder.up_blocks.{2 * stage + 2}", f"decoder.up_blocks.{stage}")]
    return (KeyLayout(
        name="Lightricks original VAE layout",
        markers=("per_channel_statistics.mean-of-means",),
        prefixes=("vae.",),
        only_prefixed=True,  # the transformer, the audio VAE and the vocoder share the file
        # Statistics the diffusers VAE does not keep (the channel index and the spread of the stds).
        dropped=("per_channel_statistics.channel", "per_channel_statistics.mean-of-stds"),
        renames=NameMap(tuple(rules)),
        segments=(("res_blocks", "resnets"),),
    ),)
