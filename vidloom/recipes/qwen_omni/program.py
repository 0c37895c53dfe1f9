"""Qwen2.5-Omni's program: chat through the thinker, and speech as thinker -> talker -> token2wav -> vocoder."""

from __future__ import annotations

from typing import Any

from vidloom.core.chat import ChatRequest
from vidloom.core.errors import InvalidRequest
from vidloom.core.instance import ModelInstance
from vidloom.core.program import Node, Program
from vidloom.decoding.loop import ARDecodeLoop
from vidloom.models.qwen_omni.decoder import text_positions
from vidloom.recipes.qwen_omni.talker_loop import TalkerLoop
from vidloom.recipes.qwen_omni.thinker_loop import ThinkerLoop
from vidloom.recipes.qwen_omni.token2wav_loop import SAMPLE_RATE, VOCODER, Token2WavLoop, vocoder_node

SPEECH_OUTPUTS = ("thinker", "codes", "mel", "audio", "sample_rate", "voice")


def chat_messages(request: ChatRequest) -> list[dict[str, str]]:
    """The request's messages for the chat template; InvalidRequest naming any part the thinker cannot read."""
    messages = []
    for i, message in enumerate(request.messages):
        for j, part in enumerate(message.content):
            if part.type != "text":
                raise InvalidRequest(f"messages[{i}].content[{j}]", f"{part.type} inputs are not supported by "
                                     "this model yet (the thinker's audio and vision encoders are not run): "
                                     "send text")
        messages.append({"role": message.role, "content": message.text})
    return messages


def chat_prompt_fn(tokenizer: Any):
    def prompt(request: ChatRequest) -> list[int]:
        ids = tokenizer.apply_chat_template(chat_messages(request), tokenize=True, add_generation_prompt=True,
                                            return_dict=True)
        return list(ids["input_ids"])

    return prompt


def eos_ids(tokenizer: Any) -> tuple[int, ...]:
    """<|im_end|> (the tokenizer's eos) ends a turn; <|endoftext|> ends a document. Either stops the thinker."""
    ids = {tokenizer.eos_token_id}
    end = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    if isinstance(end, int) and end != tokenizer.unk_token_id:
        ids.add(end)
    return tuple(sorted(i for i in ids if i is not None))


def build_program(instance: ModelInstance) -> Program:
    tokenizer, thinker = instance["tokenizer"], instance["thinker"]
    chat = ARDecodeLoop(thinker, tokenizer, chat_prompt_fn(tokenizer), text_positions, eos_ids=eos_ids(tokenizer))
    if "talker" not in instance.components:
        return Program(nodes=(), inputs=frozenset({"speech"}), outputs=(), chat_loop=chat)
    dit, vocoder = instance["token2wav"]
    nodes = (
        Node("thinker", reads=("speech",), writes=("thinker",), loop=ThinkerLoop(thinker, tokenizer, eos_ids(tokenizer))),
        Node("talker", reads=("speech", "thinker"), writes=("codes", "streamed"),
             loop=TalkerLoop(thinker, instance["talker"], instance["talker_tokens"], (dit, vocoder), SAMPLE_RATE)),
        Node("token2wav", reads=("speech", "codes"), writes=("mel",), loop=Token2WavLoop(dit)),
        Node(VOCODER, reads=("speech", "mel", "streamed"), writes=("audio", "sample_rate", "voice"), run=vocoder_node(vocoder)),
    )
    return Program(nodes=nodes, inputs=frozenset({"speech"}), outputs=SPEECH_OUTPUTS, chat_loop=chat)
