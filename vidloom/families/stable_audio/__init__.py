"""Stable Audio Open: DiT, Oobleck decoder and conditioning projection (T5 runs through transformers), cards, loading and loop."""

from __future__ import annotations

from vidloom.core.family import Family

FAMILY = Family(
    name="stable_audio",
    package=__name__,
    card_families=("stable-audio",),
    loader=".load:load_instance",
    cards={"stable-audio-demo": ".demo:demo_card"},
    demos={"stable-audio-demo": ".demo:ensure_demo_checkpoint"},
    pipelines={"StableAudioPipeline": ".cards:card_from_checkpoint"},
    capability_rows=".cards:CAPABILITY_ROWS",
    parity=".parity:PARITY",
)
