"""Helios' own option block: Helios-Distilled's amplified first chunk."""

from __future__ import annotations

from vidloom.core.options import Option, OptionBlock

AMPLIFY_FIRST_CHUNK = "amplify_first_chunk"
DMD_SAMPLER = "dmd"  # the distilled card's one sampler
DISTILLED = OptionBlock(
    "distilled",
    (Option(AMPLIFY_FIRST_CHUNK, "bool", "the first chunk runs twice the steps in every stage (more steps for the "
                                         "opening frames every later chunk builds on; off by default, as "
                                         "HeliosPyramidPipeline's is_amplify_first_chunk)"),),
    summary="DMD-distilled Helios (Helios-Distilled): the first chunk's steps",
    refusal="it is not a DMD-distilled Helios checkpoint",
)
