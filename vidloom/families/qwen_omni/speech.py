"""Admission of a speech request: pick the voice, build the thinker prompt, size it; the engine starts its run.

Forced text (speak this): the prompt is the system prompt and a user turn (the request's
`instructions`, or a plain "say this"), and the text is the assistant's turn, prefilled rather than
generated. A chat to answer aloud: its messages through the chat template, the reply generated; without a system
message of its own the card's `spoken_system_prompt` (the model card's documented prompt) leads it.
"""

from __future__ import annotations

from typing import Any

from vidloom.core.chat import ChatMessage
from vidloom.core.errors import InvalidRequest, LimitExceeded
from vidloom.core.limits import format_bytes
from vidloom.core.speech import SpeechRequest
from vidloom.families.qwen_omni.cards import SPOKEN_SYSTEM_PROMPT
from vidloom.families.qwen_omni.speakers import pick_voice
from vidloom.families.qwen_omni.memory import TALKER_EXTRA_ROWS
from vidloom.families.qwen_omni.program import media_prompter
from vidloom.families.qwen_omni.talker_loop import audio_token_budget, talker_tokens
from vidloom.families.qwen_omni.thinker_loop import SpeechPrompt

SAY_THIS = "Say the following text exactly as written."


def speech_prompt(instance: Any, limits: Any, request: SpeechRequest) -> SpeechPrompt:
    """Tokenize a validated `request` (InvalidRequest naming the field, before anything is held)."""
    voice = pick_voice(instance["speakers"], request.voice)
    tokenizer = instance["tokenizer"]
    system = instance.card.spoken_system_prompt
    if request.text is not None:
        messages = [{"role": "system", "content": system if system is not None else SPOKEN_SYSTEM_PROMPT},
                    {"role": "user", "content": request.instructions or SAY_THIS}]
        prompt = _template(tokenizer, messages)
        forced = tuple(tokenizer.encode(request.text, add_special_tokens=False))
        if not forced:
            raise InvalidRequest("input", "has no tokens to speak")
        _check_window(len(prompt) + len(forced), limits.context_window, "input")
        return SpeechPrompt(request, voice, tuple(prompt), forced, len(forced))
    chat = request.chat
    assert chat is not None
    chat.validate(limits)
    if request.instructions is not None:
        raise InvalidRequest("instructions", "applies to speaking a given text; put it in the chat's messages")
    prompt, media = media_prompter(instance).prompt(chat.messages, spoken_system(instance.card, chat.messages))
    budget = chat.sampling.completion_budget(len(prompt), limits)
    return SpeechPrompt(request, voice, tuple(prompt), None, budget, media)


def spoken_system(card: Any, messages: tuple[ChatMessage, ...]) -> str | None:
    """The system turn a spoken reply to `messages` is led by: the card's `spoken_system_prompt`, unless they have a
    system message of their own (None: they do, or the card has none)."""
    return None if any(m.role == "system" for m in messages) else card.spoken_system_prompt


def _template(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=True)
    return list(ids["input_ids"])


def _check_window(tokens: int, window: int, field: str) -> None:
    if tokens >= window:
        raise LimitExceeded(field, f"the prompt and text are {tokens} tokens, more than the context window of "
                                   f"{window}", "context_window")


def admit_speech(engine: Any, request: SpeechRequest) -> tuple[dict[str, Any], int]:
    """The run slots that speak a validated `request` on `engine` (an EngineAPI with a paged decoder: the thinker's
    KV comes from its pool) and the estimated bytes the engine's admission holds while it is resident;
    LimitExceeded naming the field that sizes it when it could not fit even alone."""
    prompt = speech_prompt(engine.instance, engine.decoder.limits, request)
    nbytes = engine.estimator(prompt) if engine.estimator is not None else 0
    check_memory(prompt, nbytes, engine.limits.max_memory_bytes)
    check_talker_pool(prompt, engine.decoder.pool_of(engine.instance["talker"]).layout)
    return {"speech": prompt}, nbytes


def _sizing_field(prompt: SpeechPrompt) -> str:
    """The request field that sizes its speech: max_audio_tokens when given, else the text or the reply budget."""
    request = prompt.request
    return ("max_audio_tokens" if request.max_audio_tokens is not None
            else "input" if request.text is not None else "max_tokens")


def check_talker_pool(prompt: SpeechPrompt, layout: Any) -> None:
    """Refuse a request whose talker sequence (prompt rows + its code budget) could never fit the talker's paged
    pool, even empty, before anything runs (a fitting one that finds the pool busy when its talker starts waits
    for the blocks on the AsyncEngine, RequestRun.kv_wait; stepped alone it fails with KVPoolBusy)."""
    tokens = talker_tokens(len(prompt.prompt_ids) + TALKER_EXTRA_ROWS, audio_token_budget(prompt, prompt.max_tokens))
    capacity = layout.num_blocks * layout.block_size
    if tokens > capacity:
        raise LimitExceeded(_sizing_field(prompt), f"the talker needs up to {tokens} tokens of KV (prompt and "
                                                   f"speech codes), more than its pool's {capacity} "
                                                   "(kv_pool_tokens, --kv-pool-tokens); ask for less speech",
                            "kv_pool_tokens")


def check_memory(prompt: SpeechPrompt, needed: int, limit: int | None) -> None:
    """Refuse a request whose estimate exceeds what the device holds for one request, naming what sizes it:
    max_audio_tokens when given, else the text to speak (input) or the reply's budget (max_tokens)."""
    if limit is None or needed <= limit:
        return
    raise LimitExceeded(_sizing_field(prompt), f"speaking {len(prompt.prompt_ids)} prompt and up to "
                                               f"{prompt.max_tokens} reply tokens needs an estimated "
                                               f"{format_bytes(needed)}, more than the per-request memory limit of "
                                               f"{format_bytes(limit)} (max_request_memory); ask for less speech",
                        "max_request_memory")
