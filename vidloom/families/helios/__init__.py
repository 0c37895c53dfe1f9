"""Helios (real-time long video): its transformer with history latents (our own), Wan's VAE and UMT5 text path,
cards, loading and the chunk loop, one-stage, pyramid or distilled pyramid (text, image and video to video, each
33-frame chunk streamed as it is decoded)."""

from __future__ import annotations

from vidloom.core.family import Family, LoRASupport

FAMILY = Family(
    package=__name__,
    card_families=("helios",),
    demos={"helios-demo": ".demo", "helios-pyramid-demo": ".pyramid_demo"},
    pipelines={"HeliosPipeline": ".cards:card_from_checkpoint",
               "HeliosPyramidPipeline": ".cards:card_from_checkpoint"},
    parity=None,
    options=("vidloom.core.blocks:EXTENSION", ".options:DISTILLED"),
    # diffusers' HeliosLoraLoaderMixin loads into `transformer` and converts the original (Wan-named) formats as
    # Wan's does.
    lora=LoRASupport(targets=(("transformer", ".config:HELIOS_TRANSFORMER_NAME_MAP"),),
                     converter="vidloom.lora.formats:wan_keys"),
    token_layout=".parallel:token_layout",
)
