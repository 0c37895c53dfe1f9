"""Cosmos3 Omni: the mixture-of-transformers backbone, its cards, loading, generation and chat loops, actions and sessions."""

from __future__ import annotations

from vidloom.core.family import Family

FAMILY = Family(
    name="cosmos3",
    package=__name__,
    card_families=("cosmos3",),
    loader=".load:load_instance",
    cards={"cosmos3-demo": ".demo:demo_card", "cosmos3-action-demo": ".action_demo:demo_card"},
    demos={"cosmos3-demo": ".demo:ensure_demo_checkpoint",
           "cosmos3-action-demo": ".action_demo:ensure_demo_checkpoint"},
    pipelines={"Cosmos3OmniPipeline": ".cards:card_from_checkpoint"},
    capability_rows=".cards:CAPABILITY_ROWS",
    parity=".parity:PARITY",
)
