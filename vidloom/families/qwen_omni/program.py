"""Qwen2.5-Omni's program: chat through the thinker, and speech as thinker -> talker -> token2wav -> vocoder."""

from __future__ import annotations

from typing import Any

from vidloom.core.instance import ModelInstance
from vidloom.core.program import Node, Program
from vidloom.families.qwen_omni.encoders import MEDIA_TOKENS
from vidloom.models.omni_chat import MediaChatLoop
from vidloom.models.omni_media import MediaPrompter
from vidloom.families.qwen_omni.talker_loop import TalkerLoop
from vidloom.families.qwen_omni.thinker_loop import ThinkerLoop
from vidloom.families.qwen_omni.token2wav_loop import SAMPLE_RATE, VOCODER, Token2WavLoop, vocoder_node

SPEECH_OUTPUTS = ("thinker", "codes", "mel", "audio", "sample_rate", "voice")


def media_prompter(instance: ModelInstance) -> MediaPrompter:
    """The instance's template, processors and towers (the towers and processors may be absent: text only)."""
    encoders = instance.components.get("encoders")
    return MediaPrompter(instance["tokenizer"], instance.components.get("processors"), encoders,
                         encoders.merge_size if encoders is not None else 2, MEDIA_TOKENS)


def eos_ids(tokenizer: Any) -> tuple[int, ...]:
    """<|im_end|> (the tokenizer's eos) ends a turn; <|endoftext|> ends a document. Either stops the thinker."""
    ids = {tokenizer.eos_token_id}
    end = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    if isinstance(end, int) and end != tokenizer.unk_token_id:
        ids.add(end)
    return tuple(sorted(i for i in ids if i is not None))


def chat_inputs(towers: Any) -> frozenset[str]:
    """The message parts chat reads: text, and audio and images where the checkpoint has their towers."""
    if towers is None:
        return frozenset({"text"})
    return frozenset({"text"} | ({"audio"} if towers.audio is not None else set())
                     | ({"image"} if towers.vision is not None else set()))


def build_program(instance: ModelInstance) -> Program:
    tokenizer, thinker = instance["tokenizer"], instance["thinker"]
    prompter = media_prompter(instance)
    chat = MediaChatLoop(thinker, tokenizer, prompter, eos_ids=eos_ids(tokenizer))
    reads = chat_inputs(prompter.encoders)
    if "talker" not in instance.components:
        return Program(nodes=(), inputs=frozenset({"speech"}), outputs=(), chat_loop=chat, chat_inputs=reads)
    dit, vocoder = instance["token2wav"]
    nodes = (
        Node("thinker", reads=("speech",), writes=("thinker",), loop=ThinkerLoop(thinker, tokenizer, eos_ids(tokenizer), prompter)),
        Node("talker", reads=("speech", "thinker"), writes=("codes", "streamed"),
             loop=TalkerLoop(thinker, instance["talker"], instance["talker_tokens"], (dit, vocoder), SAMPLE_RATE)),
        Node("token2wav", reads=("speech", "codes"), writes=("mel",), loop=Token2WavLoop(dit)),
        Node(VOCODER, reads=("speech", "mel", "streamed"), writes=("audio", "sample_rate", "voice"), run=vocoder_node(vocoder)),
    )
    # The talker's decode steps run on a paged pool of its own layout, batched across requests.
    return Program(nodes=nodes, inputs=frozenset({"speech"}), outputs=SPEECH_OUTPUTS, chat_loop=chat,
                   paged_networks=(instance["talker"],), chat_inputs=reads,
                   voices=tuple(instance["speakers"]))
