"""Stable Audio Open: DiT, Oobleck decoder and conditioning projection (T5 runs through transformers), cards, loading and loop."""

from __future__ import annotations

from vidloom.core.family import Family, LoRASupport

FAMILY = Family(
    package=__name__,
    card_families=("stable-audio",),
    demos={"stable-audio-demo": ".demo"},
    pipelines={"StableAudioPipeline": ".cards:card_from_checkpoint"},
    options=("vidloom.core.blocks:AUDIO_LENGTH",),
    # diffusers gives StableAudioPipeline no LoRA loader: PEFT adapters on its StableAudioDiTModel, in the layout
    # save_lora_weights writes (`transformer.<module>.lora_A.weight`), reach our DiT through its weight name map.
    lora=LoRASupport(targets=(("transformer", ".transformer:STABLE_AUDIO_DIT_NAME_MAP"),)),
    token_layout=".parallel:token_layout",
)
