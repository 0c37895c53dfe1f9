"""Admission of a Qwen3-Omni speech request: pick the voice, build the thinker prompt, size it.

Forced text (speak this): a user turn (the request's `instructions`, or a plain "say this") answered by the text,
prefilled rather than generated; a chat to answer aloud: its messages through the chat template (its audio, image
and video parts prepared for the thinker's towers, as a text chat's), the reply generated. Voices are the checkpoint's
`talker_config.speaker_id` names (case-insensitive, as generate() reads them).
"""

from __future__ import annotations

from typing import Any

from vidloom.core.errors import InvalidRequest, LimitExceeded
from vidloom.core.limits import format_bytes
from vidloom.core.speech import SpeechRequest
from vidloom.families.qwen3_omni.program import media_prompter
from vidloom.families.qwen3_omni.speech_loops import SpeechPrompt, frame_budget

SAY_THIS = "Say the following text exactly as written."


def pick_voice(speakers: dict[str, int], name: str | None) -> tuple[str, int]:
    """(voice name, codec id): the named voice, the first one when None; InvalidRequest naming `voice`."""
    if name is None:
        return next(iter(speakers.items()))
    if name.lower() not in speakers:
        raise InvalidRequest("voice", f"unknown voice {name!r}; available voices: {', '.join(sorted(speakers))}")
    return name.lower(), speakers[name.lower()]


def speech_prompt(instance: Any, limits: Any, request: SpeechRequest) -> SpeechPrompt:
    """Tokenize a validated `request` (InvalidRequest naming the field, before anything is held)."""
    voice, voice_id = pick_voice(instance["speech"].speakers, request.voice)
    tokenizer = instance["tokenizer"]
    if request.text is not None:
        turns = [{"role": "user", "content": request.instructions or SAY_THIS}]
        prompt = list(tokenizer.apply_chat_template(turns, tokenize=True, add_generation_prompt=True,
                                                    return_dict=True)["input_ids"])
        text = tuple(tokenizer.encode(request.text, add_special_tokens=False))
        if not text:
            raise InvalidRequest("input", "has no tokens to speak")
        forced = text + (tokenizer.eos_token_id,)  # the turn's end: where the talker's text ends
        if len(prompt) + len(forced) >= limits.context_window:
            raise LimitExceeded("input", f"the prompt and text are {len(prompt) + len(forced)} tokens, more than "
                                         f"the context window of {limits.context_window}", "context_window")
        return SpeechPrompt(request, voice, voice_id, tuple(prompt), forced, len(forced))
    chat = request.chat
    assert chat is not None
    chat.validate(limits)
    if request.instructions is not None:
        raise InvalidRequest("instructions", "applies to speaking a given text; put it in the chat's messages")
    prompt, media = media_prompter(instance).prompt(chat.messages)
    return SpeechPrompt(request, voice, voice_id, tuple(prompt), None,
                        chat.sampling.completion_budget(len(prompt), limits), media)


def admit_speech(engine: Any, request: SpeechRequest) -> tuple[dict[str, Any], int]:
    """The run slots that speak a validated `request` on `engine` and its estimated bytes (families.qwen3_omni.memory,
    what the engine's admission holds while it is resident); LimitExceeded naming the field that sizes it when it
    could never fit: over max_request_memory, or a talker sequence over the talker's pool."""
    prompt = speech_prompt(engine.instance, engine.decoder.limits, request)
    field = ("max_audio_tokens" if request.max_audio_tokens is not None
             else "input" if request.text is not None else "max_tokens")
    nbytes = engine.estimator(prompt) if engine.estimator is not None else 0
    limit = engine.limits.max_memory_bytes
    if limit is not None and nbytes > limit:
        raise LimitExceeded(field, f"speaking {len(prompt.prompt_ids)} prompt and up to {prompt.max_tokens} reply "
                                   f"tokens needs an estimated {format_bytes(nbytes)}, more than the per-request "
                                   f"memory limit of {format_bytes(limit)} (max_request_memory); ask for less "
                                   "speech", "max_request_memory")
    layout = engine.decoder.pool_of(engine.instance["talker"].decoder).layout
    # The talker's prefill: every user turn's tokens and the assistant turn's 9 rows (at most the prompt + 9).
    tokens = len(prompt.prompt_ids) + 9 + frame_budget(prompt, prompt.max_tokens)
    capacity = layout.num_blocks * layout.block_size
    if tokens > capacity:
        raise LimitExceeded(field, f"the talker needs up to {tokens} tokens of KV (prompt and speech frames), more "
                                   f"than its pool's {capacity} (kv_pool_tokens, --kv-pool-tokens); ask for less "
                                   "speech", "kv_pool_tokens")
    return {"speech": prompt}, nbytes
