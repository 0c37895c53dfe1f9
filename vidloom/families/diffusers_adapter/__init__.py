"""Any other diffusers pipeline, run by diffusers itself as one loop the runtime drives step by step."""

from __future__ import annotations

from vidloom.core.family import Family

FAMILY = Family(
    package=__name__,
    card_families=("diffusers-adapter",),
    demos={"diffusers-adapter-demo": ".demo"},
    catch_all=".cards:card_from_checkpoint",  # any diffusers pipeline class no other family names
    parity=None,  # diffusers runs it: there is nothing of ours to compare
    options=("vidloom.core.blocks:AUDIO_LENGTH",),  # audio pipelines with a length argument
)
