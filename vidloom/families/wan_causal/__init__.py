"""AnyFlow-FAR (causal chunked Wan2.1): block-causal DiT with a per-layer KV cache and compressed far context; card, loader, chunk-rollout loop and program."""

from __future__ import annotations

from vidloom.core.family import Family, LoRASupport

FAMILY = Family(
    package=__name__,
    card_families=("anyflow-far",),
    demos={"far-demo": ".demo"},
    pipelines={"AnyFlowFARPipeline": ".cards:card_from_checkpoint"},
    # AnyFlowFARPipeline loads through WanLoraLoaderMixin: Wan's keys, plus the FAR-only modules.
    lora=LoRASupport(targets=(("transformer", ".config:FAR_TRANSFORMER_NAME_MAP"),),
                     converter="vidloom.lora.formats:wan_keys"),
    options=("vidloom.core.blocks:EXTENSION",),
    token_layout=".parallel:token_layout",
)
