"""Cosmos3 Omni: the mixture-of-transformers backbone, its cards, loading, generation and chat loops, actions and sessions."""

from __future__ import annotations

from vidloom.core.family import Family, LoRASupport

FAMILY = Family(
    package=__name__,
    card_families=("cosmos3",),
    demos={"cosmos3-demo": ".demo", "cosmos3-action-demo": ".action_demo"},
    pipelines={"Cosmos3OmniPipeline": ".cards:card_from_checkpoint"},
    options=(".options:REASONING", ".options:SOUND", "vidloom.core.blocks:ACTION"),
    # Cosmos3OmniPipeline has no LoRA loader: PEFT adapters on its Cosmos3OmniTransformer, saved as a transformer
    # LoRA (`transformer.<module>.lora_A.weight`). That one module is our chat backbone (the prompt's pathway,
    # whose K/V generation attends) and our generator (the generation pathways): each layer goes where it lives.
    lora=LoRASupport(targets=(("transformer", ".transformer:TEXT_NAME_MAP"), ("generator", ".generation:GEN_NAME_MAP")),
                     reads={"generator": "transformer"}),
    token_layout=".parallel:token_layout",
)
