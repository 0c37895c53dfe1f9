"""Cosmos3's program: the chat prompt (its tokenizer's chat template), the "ar_decode" chat loop and generation."""

from __future__ import annotations

from typing import Any

from vidloom.core.chat import ChatRequest
from vidloom.core.errors import InvalidRequest
from vidloom.core.instance import ModelInstance
from vidloom.core.program import Program
from vidloom.decoding.loop import ARDecodeLoop
from vidloom.diffusion.guidance import ParallelCFG
from vidloom.layers.rotary import text_positions


def chat_prompt_fn(tokenizer: Any):
    """Request -> prompt ids through the checkpoint's chat template (generation prompt appended)."""

    def prompt(request: ChatRequest) -> list[int]:
        messages = []
        for i, message in enumerate(request.messages):
            for j, part in enumerate(message.content):
                if part.type != "text":
                    # The diffusers checkpoint carries no vision tower (its generation pathway reads VAE
                    # latents), so the understanding pathway has nothing to encode an input image with.
                    raise InvalidRequest(f"messages[{i}].content[{j}]", f"this model does not accept {part.type} "
                                         "inputs (the checkpoint has no vision or audio encoder for the reasoning "
                                         "pathway)")
            messages.append({"role": message.role, "content": message.text})
        ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=True)
        return list(ids["input_ids"])

    return prompt


def build_program(instance: ModelInstance, guidance: ParallelCFG | None = None) -> Program:
    """The chat loop (the program's `chat_loop`), plus the generation nodes when the card generates. `guidance`: a
    --cfg-parallel rank pair's ParallelCFG, whose pair runs one CFG branch per rank (gen_loop.denoise_step)."""
    tokenizer = instance["tokenizer"]
    loop = ARDecodeLoop(instance["transformer"], tokenizer, chat_prompt_fn(tokenizer), text_positions,
                        eos_ids=(tokenizer.eos_token_id,))
    if not instance.card.tasks:
        return Program(nodes=(), inputs=frozenset({"request"}), outputs=(), chat_loop=loop)
    from vidloom.families.cosmos3.gen_program import generation_nodes

    pair = guidance.pair if guidance is not None else None
    return Program(nodes=generation_nodes(instance, loop, pair=pair), inputs=frozenset({"request"}),
                   outputs=("video", "reasoned_prompt", "audio", "sample_rate", "actions", "action"), chat_loop=loop)
