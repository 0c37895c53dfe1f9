"""Cosmos3's own option blocks: the reasoner writing the prompt, and the soundtrack."""

from __future__ import annotations

from vidloom.core.options import Option, OptionBlock

REASONING = OptionBlock(
    "reasoning",
    (Option("reason", "bool", "the model writes a detailed prompt with its AR loop first, then generates from it "
                              "(the prompt it wrote is in the output's metadata, reasoned_prompt)"),),
    summary="unified models (Cosmos3): reason before generating",
    refusal="it has no ar_decode loop to write a prompt with",
)
SOUND = OptionBlock(
    "sound",
    (Option("sound", "bool", "a soundtrack generated with the video (in the .mp4, and with the CLI as a .wav next "
                             "to it unless --audio-out)"),),
    summary="unified models with an audio tokenizer (Cosmos3): a soundtrack",
    refusal="it has no audio tokenizer to make sound with",
)
