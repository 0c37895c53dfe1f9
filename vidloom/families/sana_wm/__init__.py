"""SANA-WM: the camera-controlled bidirectional SANA DiT, its camera input, refiner, cards, program and loop."""

from __future__ import annotations

from vidloom.core.family import Family, LoRASupport

FAMILY = Family(
    package=__name__,
    card_families=("sana-wm",),
    demos={"sana-wm-demo": ".demo"},
    pipelines={"SanaWMPipeline": ".cards:card_from_checkpoint"},
    options=(".options:CAMERA",),
    # diffusers gives SanaWMPipeline no LoRA loader: PEFT adapters on its stage-1 SanaWMTransformer3DModel, in the
    # layout save_lora_weights writes (`transformer.<module>.lora_A.weight`), reach our DiT through its weight name
    # map. Linears only (attention, camera branch, cross-attention, caption/time/out projections); the conv FFN and
    # patch embeds take none. The stage-2 refiner (LTX-2's layout) runs its base weights.
    lora=LoRASupport(targets=(("transformer", ".transformer:SANA_WM_NAME_MAP"),)),
    token_layout=".parallel:token_layout",
)
