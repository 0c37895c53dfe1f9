"""Qwen3-Omni: the thinker's MoE text decoder on the paged KV pool (chat), the talker with its code predictor and
code2wav (speech), cards, loading and a demo."""

from __future__ import annotations

from vidloom.core.family import Family

FAMILY = Family(
    package=__name__,
    card_families=("qwen3-omni",),
    demos={"qwen3-omni-demo": ".demo"},
    architectures={"Qwen3OmniMoeForConditionalGeneration": ".cards:card_from_checkpoint"},
)
