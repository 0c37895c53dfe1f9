"""The Wan-AI original key layout of the Wan2.1 / Wan2.2 transformer (and ComfyUI's prefixed copy), as data.

The original release names (`blocks.0.self_attn.q.weight`, `head.modulation`, ...) were read off diffusers 0.42.1's
`convert_wan_transformer_to_diffusers` (loaders/single_file_utils.py), the reference our parity test loads the same
file with; the table is ours (credited in NOTICE).
"""

from __future__ import annotations

from vidloom.loading.key_layout import KeyLayout
from vidloom.loading.name_map import NameMap

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
