"""Helios (real-time long video): its transformer with history latents (our own), Wan's VAE and UMT5 text path,
cards, loading and the chunk loop, one-stage or pyramid (text to video, each 33-frame chunk streamed as it is decoded)."""

from __future__ import annotations

from vidloom.core.family import Family

FAMILY = Family(
    package=__name__,
    card_families=("helios",),
    demos={"helios-demo": ".demo"},
    pipelines={"HeliosPipeline": ".cards:card_from_checkpoint",
               "HeliosPyramidPipeline": ".cards:card_from_checkpoint"},
    parity=None,
)
