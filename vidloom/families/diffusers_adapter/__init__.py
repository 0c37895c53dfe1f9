"""Any other diffusers pipeline, run by diffusers itself as one loop the runtime drives step by step."""

from __future__ import annotations

from vidloom.core.family import Family

FAMILY = Family(
    name="diffusers_adapter",
    package=__name__,
    card_families=("diffusers-adapter",),
    loader=".load:load_instance",
    cards={"diffusers-adapter-demo": ".demo:demo_card"},
    demos={"diffusers-adapter-demo": ".demo:ensure_demo_checkpoint"},
    catch_all=".cards:card_from_checkpoint",  # any diffusers pipeline class no other family names
    capability_rows=".cards:CAPABILITY_ROWS",
)
