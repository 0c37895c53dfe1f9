"""The Helios program: encode text -> the chunk rollout (each chunk denoised, decoded and streamed in turn)."""

from __future__ import annotations

from typing import Any, Mapping

from vidloom.core.instance import ModelInstance
from vidloom.core.program import Node, NodeContext, Program
from vidloom.diffusion.guidance import GuidancePolicy, make_guidance
from vidloom.families.helios.loop import HeliosChunkLoop
from vidloom.models.wan.text import WanTextEncoder, encode_request_prompts


def build_program(instance: ModelInstance, guidance: GuidancePolicy | None = None) -> Program:
    text: WanTextEncoder = instance["text_encoder"]

    def encode_text(slots: Mapping[str, Any], ctx: NodeContext) -> dict[str, Any]:
        return encode_request_prompts(text, slots["request"])

    policy = guidance if guidance is not None else make_guidance(instance.deploy.cfg_mode)
    loop = HeliosChunkLoop(instance["transformer"], instance["vae"], instance["schedule"], instance.dtype, policy,
                           instance.device)
    return Program(
        nodes=(
            Node("encode_text", reads=("request",), writes=("prompt_embeds", "negative_embeds"), run=encode_text),
            Node("chunks", reads=("request", "prompt_embeds", "negative_embeds"), writes=("video",), loop=loop),
        ),
        inputs=frozenset({"request"}),
        outputs=("video",),
    )
