"""Stable Audio Open: DiT, Oobleck decoder and conditioning projection (T5 runs through transformers), cards, loading and loop."""

from __future__ import annotations

from vidloom.core.family import Family

FAMILY = Family(
    package=__name__,
    card_families=("stable-audio",),
    demos={"stable-audio-demo": ".demo"},
    pipelines={"StableAudioPipeline": ".cards:card_from_checkpoint"},
    options=("vidloom.core.blocks:AUDIO_LENGTH",),
)
