"""cosmos3-action-demo: the Cosmos3 Omni architecture with the action pathway, tiny, seeded random weights.

Everything cosmos3-demo has but sound, plus `action_gen`: per-embodiment action projections for every
domain with a fixed width (action_dim 30 covers all but hand_pose's 57), so forward dynamics, policy and
inverse dynamics can be tried offline. A separate demo, not a new version of cosmos3-demo, whose files
are kept byte for byte. Its weights are random: its videos and actions are noise by design.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from vidloom.core.card import ModelCard, RecipeSpec
from vidloom.families.cosmos3 import demo
from vidloom.families.cosmos3.cards import AR_LOOP, action_limits, cosmos3_card
from vidloom.demo.cache import DemoCheckpoint, noise_note
from vidloom.demo.writer import write_pipeline_files

DEMO_ID = "cosmos3-action-demo"
DEMO_VERSION = 1  # bump when the demo's architecture or files change
DEMO_SEED = 20260401
DEMO_NOTE = noise_note(DEMO_ID, "Cosmos3 Omni with actions")
ACTION_DIM = 30  # the widest fixed-width embodiment (galbot); narrower ones are zero-padded to it
DOMAINS = 21  # domain ids 0..20 (fractal is 20)
DEMO_TRANSFORMER = {
    **{k: v for k, v in demo.DEMO_TRANSFORMER.items() if k not in ("sound_gen", "sound_dim")},
    "action_gen": True, "action_dim": ACTION_DIM, "num_embodiment_domains": DOMAINS,
}
MODEL_INDEX = {k: v for k, v in demo.MODEL_INDEX.items() if k != "sound_tokenizer"}


def demo_card() -> ModelCard:
    card = cosmos3_card(
        DEMO_ID, f"demo:{DEMO_ID}", generates=True, sound=False, defaults=demo.DEMO_DEFAULTS, precision="float32",
        description="Cosmos3 Omni with actions (forward/inverse dynamics, policy; chat, text to video) at a tiny "
                    "size, random weights",
        notes=(DEMO_NOTE,), actions=action_limits(DEMO_TRANSFORMER),
    )
    return dataclasses.replace(card, recipe=RecipeSpec(method="random-init", loop=AR_LOOP))


def write_demo_checkpoint(folder: Path) -> None:
    """A Cosmos3OmniPipeline folder (action pathway, no sound) from our own modules; diffusers loads it too."""
    demo.write_backbone(folder, DEMO_TRANSFORMER, DEMO_SEED)
    write_pipeline_files(folder, demo.DEMO_SCHEDULER, MODEL_INDEX)


ensure_demo_checkpoint = DemoCheckpoint(DEMO_ID, DEMO_VERSION, write_demo_checkpoint).ensure
