"""Cosmos3 Omni: the mixture-of-transformers backbone, its cards, loading, generation and chat loops, actions and sessions."""

from __future__ import annotations

from vidloom.core.family import Family

FAMILY = Family(
    package=__name__,
    card_families=("cosmos3",),
    demos={"cosmos3-demo": ".demo", "cosmos3-action-demo": ".action_demo"},
    pipelines={"Cosmos3OmniPipeline": ".cards:card_from_checkpoint"},
    options=(".options:REASONING", ".options:SOUND", "vidloom.core.blocks:ACTION"),
)
