"""Qwen3-Omni's program: chat through the thinker (the runtime's AR decode loop on the paged KV pool, with audio,
image and video parts through its towers where the checkpoint has them), and with a talker speech as thinker ->
talker (with its code predictor) -> code2wav, a spoken answer reading the audio, image and video parts too."""

from __future__ import annotations

from typing import Any

from vidloom.core.instance import ModelInstance
from vidloom.core.program import Node, Program
from vidloom.families.qwen3_omni.encoders import MEDIA_TOKENS, POSITION_ID_PER_SECONDS
from vidloom.models.omni_chat import MediaChatLoop
from vidloom.models.omni_media import MediaPrompter


def media_prompter(instance: ModelInstance) -> MediaPrompter:
    """The instance's template, processors and towers (the towers and processors may be absent: text only)."""
    encoders = instance.components.get("encoders")
    return MediaPrompter(instance["tokenizer"], instance.components.get("processors"), encoders,
                         encoders.merge_size if encoders is not None else 2, MEDIA_TOKENS,
                         encoders.position_id_per_seconds if encoders is not None else POSITION_ID_PER_SECONDS)


def chat_inputs(towers: Any, processors: Any) -> frozenset[str]:
    """The message parts chat reads: text, and audio, images and videos where the checkpoint has their towers and
    processor settings (a video's sound track, use_audio_in_video, also needs the audio tower)."""
    if towers is None or processors is None:
        return frozenset({"text"})
    return frozenset({"text"} | ({"audio"} if towers.audio is not None else set())
                     | ({"image", "video"} if towers.vision is not None else set()))


def eos_ids(tokenizer: Any) -> tuple[int, ...]:
    """<|im_end|> (the tokenizer's eos) ends a turn; <|endoftext|> ends a document. Either stops the thinker."""
    ids = {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|endoftext|>")}
    return tuple(sorted(i for i in ids if isinstance(i, int) and i != tokenizer.unk_token_id))


SPEECH_OUTPUTS = ("thinker", "codes", "frames", "audio", "sample_rate", "voice")


def build_program(instance: ModelInstance) -> Program:
    from vidloom.families.qwen3_omni.speech_loops import Code2WavLoop, SpeechThinkerLoop, TalkerLoop

    tokenizer, thinker = instance["tokenizer"], instance["thinker"]
    prompter = media_prompter(instance)
    chat = MediaChatLoop(thinker, tokenizer, prompter, eos_ids(tokenizer))
    reads = chat_inputs(prompter.encoders, prompter.processors)
    if "talker" not in instance.components:
        return Program(nodes=(), inputs=frozenset({"request"}), outputs=(), chat_loop=chat, chat_inputs=reads)
    talker, code2wav = instance["talker"], instance["code2wav"]
    nodes = (
        Node("thinker", reads=("speech",), writes=("thinker",),
             loop=SpeechThinkerLoop(thinker, tokenizer, eos_ids(tokenizer), prompter)),
        Node("talker", reads=("speech", "thinker"), writes=("codes", "frames", "streamed"),
             loop=TalkerLoop(thinker, talker, code2wav, eos_ids(tokenizer))),
        Node("code2wav", reads=("speech", "frames", "streamed"), writes=("audio", "sample_rate", "voice"),
             loop=Code2WavLoop(code2wav)),
    )
    # The talker's decode steps run on a paged pool of its own layout, batched across requests.
    return Program(nodes=nodes, inputs=frozenset({"speech"}), outputs=SPEECH_OUTPUTS, chat_loop=chat,
                   paged_networks=(talker.decoder,), chat_inputs=reads, voices=tuple(instance["speech"].speakers))
