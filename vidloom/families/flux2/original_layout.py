"""BFL's original key layout of the FLUX.2 transformer (and ComfyUI's prefixed copy), as data.

Names and the two row ops (a fused qkv split in three in the double blocks; the final modulation stored as
(shift, scale) where diffusers has (scale, shift)) were read off diffusers 0.42.1's
`convert_flux2_transformer_checkpoint_to_diffusers`, the reference our parity test loads the same file with; the
table is ours (credited in NOTICE).
"""

from __future__ import annotations

from vidloom.loading.key_layout import KeyLayout, RowSplit
from vidloom.loading.name_map import NameMap

_DOUBLE = "double_blocks.{n}"
_BLOCK = "transformer_blocks.{n}"
_SINGLE = "single_blocks.{n}"
_SINGLE_BLOCK = "single_transformer_blocks.{n}"

FLUX2_BFL = KeyLayout(
    name="BFL original layout",
    markers=("single_stream_modulation.lin.weight",),
    prefixes=("model.diffusion_model.",),
    renames=NameMap((
        ("img_in", "x_embedder"),
        ("txt_in", "context_embedder"),
        ("time_in.in_layer", "time_guidance_embed.timestep_embedder.linear_1"),
        ("time_in.out_layer", "time_guidance_embed.timestep_embedder.linear_2"),
        ("guidance_in.in_layer", "time_guidance_embed.guidance_embedder.linear_1"),
        ("guidance_in.out_layer", "time_guidance_embed.guidance_embedder.linear_2"),
        ("double_stream_modulation_img.lin", "double_stream_modulation_img.linear"),
        ("double_stream_modulation_txt.lin", "double_stream_modulation_txt.linear"),
        ("single_stream_modulation.lin", "single_stream_modulation.linear"),
        ("final_layer.adaLN_modulation.1", "norm_out.linear"),
        ("final_layer.linear", "proj_out"),
        # Norm gains are `.scale` in the original, `.weight` in diffusers: whole keys.
        (f"{_DOUBLE}.img_attn.norm.query_norm.scale", f"{_BLOCK}.attn.norm_q.weight"),
        (f"{_DOUBLE}.img_attn.norm.key_norm.scale", f"{_BLOCK}.attn.norm_k.weight"),
        (f"{_DOUBLE}.txt_attn.norm.query_norm.scale", f"{_BLOCK}.attn.norm_added_q.weight"),
        (f"{_DOUBLE}.txt_attn.norm.key_norm.scale", f"{_BLOCK}.attn.norm_added_k.weight"),
        (f"{_DOUBLE}.img_attn.proj", f"{_BLOCK}.attn.to_out.0"),
        (f"{_DOUBLE}.txt_attn.proj", f"{_BLOCK}.attn.to_add_out"),
        (f"{_DOUBLE}.img_mlp.0", f"{_BLOCK}.ff.linear_in"),
        (f"{_DOUBLE}.img_mlp.2", f"{_BLOCK}.ff.linear_out"),
        (f"{_DOUBLE}.txt_mlp.0", f"{_BLOCK}.ff_context.linear_in"),
        (f"{_DOUBLE}.txt_mlp.2", f"{_BLOCK}.ff_context.linear_out"),
        (f"{_SINGLE}.linear1", f"{_SINGLE_BLOCK}.attn.to_qkv_mlp_proj"),
        (f"{_SINGLE}.linear2", f"{_SINGLE_BLOCK}.attn.to_out"),
        (f"{_SINGLE}.norm.query_norm.scale", f"{_SINGLE_BLOCK}.attn.norm_q.weight"),
        (f"{_SINGLE}.norm.key_norm.scale", f"{_SINGLE_BLOCK}.attn.norm_k.weight"),
    )),
    splits=(
        RowSplit(f"{_DOUBLE}.img_attn.qkv", tuple(f"{_BLOCK}.attn.to_{p}" for p in "qkv")),
        RowSplit(f"{_DOUBLE}.txt_attn.qkv", tuple(f"{_BLOCK}.attn.add_{p}_proj" for p in "qkv")),
    ),
    swapped=("final_layer.adaLN_modulation.1",),
)
FLUX2_TRANSFORMER_LAYOUTS = (FLUX2_BFL,)
