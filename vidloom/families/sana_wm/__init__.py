"""SANA-WM: the camera-controlled bidirectional SANA DiT, its camera input, refiner, cards, program and loop."""

from __future__ import annotations

from vidloom.core.family import Family

FAMILY = Family(
    package=__name__,
    card_families=("sana-wm",),
    demos={"sana-wm-demo": ".demo"},
    pipelines={"SanaWMPipeline": ".cards:card_from_checkpoint"},
    options=(".options:CAMERA",),
)
