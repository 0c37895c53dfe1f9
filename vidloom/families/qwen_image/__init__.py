"""Qwen-Image: its MMDiT transformer (our own), Wan's VAE architecture, the Qwen2.5-VL text path, cards, loading,
loop and program (text to image with true CFG, edits of one or several images)."""

from __future__ import annotations

from vidloom.core.family import Family, LoRASupport

FAMILY = Family(
    package=__name__,
    card_families=("qwen_image",),
    demos={"qwen-image-demo": ".demo"},
    pipelines={"QwenImagePipeline": ".cards:card_from_checkpoint",
               "QwenImageEditPipeline": ".cards:card_from_checkpoint",
               "QwenImageEditPlusPipeline": ".cards:card_from_checkpoint"},
    parity=None,
    # diffusers' QwenImageLoraLoaderMixin loads into the pipeline's `transformer` only (PEFT keys); so do we.
    lora=LoRASupport(targets=(("transformer", ".transformer:QWEN_IMAGE_TRANSFORMER_NAME_MAP"),)),
    token_layout=".parallel:token_layout",
)
