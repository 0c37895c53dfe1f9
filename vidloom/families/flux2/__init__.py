"""FLUX.2 Klein: the double/single-stream transformer, its VAE, cards, loading, loop and program (text to image and edits)."""

from __future__ import annotations

from vidloom.core.family import Family, LoRASupport

FAMILY = Family(
    package=__name__,
    card_families=("flux2",),
    demos={"flux2-klein-demo": ".demo"},
    pipelines={"Flux2KleinPipeline": ".cards:card_from_checkpoint"},
    # diffusers' Flux2LoraLoaderMixin loads into the pipeline's `transformer` only; so do we.
    lora=LoRASupport(targets=(("transformer", ".transformer:FLUX2_TRANSFORMER_NAME_MAP"),),
                     converter=".lora:flux2_keys"),
    token_layout=".parallel:token_layout",
)
