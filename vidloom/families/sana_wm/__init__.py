"""SANA-WM: the camera-controlled bidirectional SANA DiT, its camera input, refiner, cards, program and loop."""

from __future__ import annotations

from vidloom.core.family import Family

FAMILY = Family(
    name="sana_wm",
    package=__name__,
    card_families=("sana-wm",),
    loader=".load:load_instance",
    cards={"sana-wm-demo": ".demo:demo_card"},
    demos={"sana-wm-demo": ".demo:ensure_demo_checkpoint"},
    pipelines={"SanaWMPipeline": ".cards:card_from_checkpoint"},
    capability_rows=".cards:CAPABILITY_ROWS",
    parity=".parity:PARITY",
)
