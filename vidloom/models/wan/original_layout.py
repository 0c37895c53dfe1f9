"""The Wan-AI original key layouts of the Wan2.1 / Wan2.2 transformer and the Wan2.1 VAE (and ComfyUI's prefixed
copies), as data.

The original release names (`blocks.0.self_attn.q.weight`, `head.modulation`, `decoder.upsamples.4.residual.0.gamma`,
...) were read off diffusers 0.42.1's `convert_wan_transformer_to_diffusers` and `convert_wan_vae_to_diffusers`
(loaders/single_file_utils.py), the references our parity tests load the same files with; the tables are ours
(credited in NOTICE).
"""

from __future__ import annotations

from vidloom.loading.key_layout import KeyLayout
from vidloom.loading.name_map import NameMap
from vidloom.models.wan.vae import WanVAEConfig

WAN_ORIGINAL = KeyLayout(
    name="Wan-AI original layout",
    markers=("head.modulation", "head.head.weight"),
    prefixes=("model.diffusion_model.",),  # ComfyUI's exports; the Wan-AI release has no prefix
    renames=NameMap((
        ("time_embedding.0", "condition_embedder.time_embedder.linear_1"),
        ("time_embedding.2", "condition_embedder.time_embedder.linear_2"),
        ("time_projection.1", "condition_embedder.time_proj"),
        ("text_embedding.0", "condition_embedder.text_embedder.linear_1"),
        ("text_embedding.2", "condition_embedder.text_embedder.linear_2"),
        ("img_emb.proj.0", "condition_embedder.image_embedder.norm1"),  # I2V / FLF2V: the CLIP token projection
        ("img_emb.proj.1", "condition_embedder.image_embedder.ff.net.0.proj"),
        ("img_emb.proj.3", "condition_embedder.image_embedder.ff.net.2"),
        ("img_emb.proj.4", "condition_embedder.image_embedder.norm2"),
        # FLF2V's learned positions of the two frames' CLIP tokens (Wan's MLPProj.emb_pos); diffusers 0.42.1's
        # converter has no rule for it, so `from_single_file` cannot load an FLF2V file and this one is ours.
        ("img_emb.emb_pos", "condition_embedder.image_embedder.pos_embed"),
        ("head.modulation", "scale_shift_table"),
        ("head.head", "proj_out"),
        ("blocks.{n}.self_attn", "blocks.{n}.attn1"),
        ("blocks.{n}.cross_attn", "blocks.{n}.attn2"),
        ("blocks.{n}.modulation", "blocks.{n}.scale_shift_table"),
        # The original's norm3 is the (affine) norm before cross-attention, diffusers' norm2; its norm2 has no weights.
        ("blocks.{n}.norm3", "blocks.{n}.norm2"),
        ("blocks.{n}.ffn.0", "blocks.{n}.ffn.net.0.proj"),
        ("blocks.{n}.ffn.2", "blocks.{n}.ffn.net.2"),
    )),
    # Inside each attention: the projections and the image-token (I2V) keys.
    segments=(("q", "to_q"), ("k", "to_k"), ("v", "to_v"), ("o", "to_out.0"), ("k_img", "add_k_proj"),
              ("v_img", "add_v_proj"), ("norm_k_img", "norm_added_k")),
)
WAN_TRANSFORMER_LAYOUTS = (WAN_ORIGINAL,)

# A residual block's layers: the original keeps them in one Sequential (RMS norm, SiLU, conv, RMS norm, SiLU, dropout,
# conv) plus a 1x1 shortcut where the channels change.
_RESIDUAL = (("residual.0", "norm1"), ("residual.2", "conv1"), ("residual.3", "norm2"), ("residual.6", "conv2"),
             ("shortcut", "conv_shortcut"))


def wan_vae_layouts(config: WanVAEConfig) -> tuple[KeyLayout, ...]:
    """The original layout of a Wan2.1 VAE of this shape (Wan2.2's residual VAE is read in the diffusers layout only).

    The original decoder is one flat list per stage: its resnets, then an upsampler on every stage but the last;
    diffusers nests them (up_blocks.{stage}.resnets.{i} / .upsamplers.0), so the flat index comes from the config.
    """
    if config.is_residual:
        return ()
    rules: list[tuple[str, str]] = [("conv1", "quant_conv"), ("conv2", "post_quant_conv")]
    for side in ("encoder", "decoder"):
        rules += [(f"{side}.conv1", f"{side}.conv_in"), (f"{side}.head.0", f"{side}.norm_out"),
                  (f"{side}.head.2", f"{side}.conv_out"), (f"{side}.middle.1", f"{side}.mid_block.attentions.0")]
        for index, resnet in ((0, 0), (2, 1)):
            rules += [(f"{side}.middle.{index}.{a}", f"{side}.mid_block.resnets.{resnet}.{b}") for a, b in _RESIDUAL]
    # The encoder's downsamples stay one flat list in diffusers too.
    rules += [(f"encoder.downsamples.{{n}}.{a}", f"encoder.down_blocks.{{n}}.{b}") for a, b in _RESIDUAL]
    rules.append(("encoder.downsamples.{n}", "encoder.down_blocks.{n}"))
    per_stage = config.num_res_blocks + 2  # the decoder's resnets per stage (one more than the encoder's) + upsampler
    for stage in range(len(config.dim_mult)):
        for resnet in range(config.num_res_blocks + 1):
            flat = f"decoder.upsamples.{stage * per_stage + resnet}"
            rules += [(f"{flat}.{a}", f"decoder.up_blocks.{stage}.resnets.{resnet}.{b}") for a, b in _RESIDUAL]
        if stage < len(config.dim_mult) - 1:
            rules.append((f"decoder.upsamples.{stage * per_stage + per_stage - 1}",
                          f"decoder.up_blocks.{stage}.upsamplers.0"))
    return (KeyLayout(name="Wan-AI original VAE layout", markers=("encoder.conv1.weight", "decoder.conv1.weight"),
                      renames=NameMap(tuple(rules))),)
