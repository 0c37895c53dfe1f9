"""HunyuanVideo-1.5: its dual-stream transformer (our own), the Qwen2.5-VL + ByT5 text path, the saved guider,
cards, loading, loop and program (text and image to video)."""

from __future__ import annotations

from vidloom.core.family import Family, LoRASupport

FAMILY = Family(
    package=__name__,
    card_families=("hunyuan15",),
    demos={"hunyuan15-demo": ".demo"},
    pipelines={"HunyuanVideo15Pipeline": ".cards:card_from_checkpoint",
               "HunyuanVideo15ImageToVideoPipeline": ".cards:card_from_checkpoint"},
    parity=None,
    # diffusers has no LoRA loader for these pipelines; PEFT adapters on the transformer (`transformer.` keys, as
    # save_lora_weights writes them) load through our name map.
    lora=LoRASupport(targets=(("transformer", ".transformer:HUNYUAN15_TRANSFORMER_NAME_MAP"),)),
    token_layout=".parallel:token_layout",
)
