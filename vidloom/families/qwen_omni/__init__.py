"""Qwen2.5-Omni: thinker and talker decoders, token2wav (flow-matching DiT and BigVGAN vocoder), cards, loading and the speech program."""

from __future__ import annotations

from vidloom.core.family import Family

FAMILY = Family(
    package=__name__,
    card_families=("qwen-omni",),
    demos={"qwen-omni-demo": ".demo"},
    architectures={
        "Qwen2_5OmniForConditionalGeneration": ".cards:card_from_checkpoint",
        # The name the released Qwen/Qwen2.5-Omni-3B and -7B config.json files give (transformers' preview name).
        "Qwen2_5OmniModel": ".cards:card_from_checkpoint",
    },
)
