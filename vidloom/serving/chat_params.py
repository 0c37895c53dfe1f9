"""A Chat Completions body -> ChatRequest; every refusal is an InvalidRequest naming the API field.

Message parsing and sampling validation are core.chat's (the Python API and the CLI share them);
this module adds what only the HTTP API has: `n`, `stream_options`, the two names of max_tokens,
OpenAI's `developer` role, and fields OpenAI defines that this server does not implement.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from vidloom.core.card import ModelCard
from vidloom.core.chat import ChatLimits, ChatRequest, SamplingParams, messages_from_openai, stop_tuple
from vidloom.core.errors import InvalidRequest
from vidloom.core.speech import voice_from_openai
from vidloom.serving.chat_protocol import ChatCompletionBody
from vidloom.serving.params import check_model

# Fields OpenAI defines that change the answer and are not implemented: refused by name, never ignored.
# `frequency_penalty` / `presence_penalty` 0 and `logprobs` false are their no-op values and pass.
_NOOP_VALUES: dict[str, object] = {"frequency_penalty": 0.0, "presence_penalty": 0.0, "logprobs": False}
# OpenAI's newer name for the system role (o1 and later); the same instruction to the model.
_ROLE_ALIASES = {"developer": "system"}


@dataclass(frozen=True)
class PlannedChat:
    """A request ready for the engine plus how to answer it."""

    request: ChatRequest
    stream: bool
    include_usage: bool  # streaming: one more chunk with the usage counts before [DONE]
    audio: tuple[str | None, str] | None = None  # (voice, format) when the answer is spoken too


def plan_chat(body: ChatCompletionBody, card: ModelCard, limits: ChatLimits | None = None) -> PlannedChat:
    """Map a body onto a ChatRequest; raises InvalidRequest (or UnknownModel) naming the field.

    `limits` None: only the limit-free checks run here; the engine checks the rest at admission against
    its own limits (its KV pool bounds max_tokens), naming the field the same way.
    """
    check_model(body.model, card)
    if "ar_decode" not in card.loops:
        tasks = ", ".join(sorted(t.value for t in card.tasks))
        raise InvalidRequest("model", f"{card.model_id} does not support chat completions (it has no text decode "
                                      f"loop; it serves {tasks})")
    _refuse_unsupported(body)
    if body.n is not None and body.n != 1:
        raise InvalidRequest("n", f"only n=1 is supported (one choice per request), got {body.n}")
    stream = bool(body.stream)
    if body.stream_options is not None and not stream:
        raise InvalidRequest("stream_options", "is only allowed with stream=true")
    # Images are decoded here; whether the model takes them is the engine's call (it names the part).
    messages = messages_from_openai(_aliased_roles(body.messages), _load_image, _load_audio, _load_video)
    sampling = SamplingParams(
        max_tokens=_max_tokens(body),
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        top_k=_top_k(body.top_k),
        seed=body.seed,
        stop=stop_tuple(body.stop),
    )
    request = ChatRequest(messages=messages, sampling=sampling)
    request.validate(limits)
    include_usage = stream and body.stream_options is not None and body.stream_options.include_usage
    return PlannedChat(request, stream, include_usage, _audio(body, card))


CHAT_AUDIO_FORMATS = ("wav", "mp3", "flac", "opus", "pcm16")  # OpenAI's audio.format values


def _audio(body: ChatCompletionBody, card: ModelCard) -> tuple[str | None, str] | None:
    """(voice, format) of a spoken answer, or None; InvalidRequest naming `modalities` or `audio.*`."""
    modalities = body.modalities if body.modalities is not None else ["text"]
    if not isinstance(modalities, list) or any(m not in ("text", "audio") for m in modalities) or \
            "text" not in modalities:
        raise InvalidRequest("modalities", f"must be [\"text\"] or [\"text\", \"audio\"], got {modalities!r}")
    if "audio" not in modalities:
        if body.audio is not None:
            raise InvalidRequest("audio", "is only allowed with modalities [\"text\", \"audio\"]")
        return None
    if card.speech is None:
        raise InvalidRequest("modalities", f"{card.model_id} cannot answer with audio (its card has no talker)")
    if body.audio is None:
        raise InvalidRequest("audio", "is required with modalities [\"text\", \"audio\"] ({voice, format})")
    if body.audio.format not in CHAT_AUDIO_FORMATS:
        raise InvalidRequest("audio.format", f"unsupported format {body.audio.format!r}; supported: "
                                             f"{', '.join(CHAT_AUDIO_FORMATS)}")
    return voice_from_openai(body.audio.voice, "audio.voice"), body.audio.format


def spoken_max_tokens(body: ChatCompletionBody) -> int | None:
    """The max_tokens of a chat answered aloud, read before its media parts are (its time budget is checked
    first); None for a text answer or no max_tokens. plan_chat names any problem with these fields."""
    if not isinstance(body.modalities, list) or "audio" not in body.modalities:
        return None
    value = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    return value if isinstance(value, int) and value > 0 else None


def has_media_parts(body: ChatCompletionBody) -> bool:
    """Whether any message has an image_url, input_audio or video_url part (planning then decodes them: a job for
    the media pool)."""
    messages = body.messages if isinstance(body.messages, list) else ()
    return any(
        isinstance(part, Mapping) and part.get("type") in ("image_url", "input_audio", "video_url")
        for message in messages if isinstance(message, Mapping) and isinstance(message.get("content"), list)
        for part in message["content"]
    )


def _refuse_unsupported(body: ChatCompletionBody) -> None:
    for name in body.model_extra or {}:
        raise InvalidRequest(name, "is not supported by this server")
    for name, noop in _NOOP_VALUES.items():
        value = getattr(body, name)
        if value is not None and value != noop:
            raise InvalidRequest(name, f"is not supported by this server (only {noop!r} is accepted)")


def _max_tokens(body: ChatCompletionBody) -> int | None:
    """max_completion_tokens (OpenAI's current name) or max_tokens; both given must agree."""
    new, old = body.max_completion_tokens, body.max_tokens
    if new is not None and old is not None and new != old:
        raise InvalidRequest("max_completion_tokens", f"is {new} but max_tokens is {old}; send one of them")
    value = new if new is not None else old
    if value is not None and value < 1:
        field = "max_completion_tokens" if new is not None else "max_tokens"
        raise InvalidRequest(field, f"must be >= 1, got {value}")
    return value


def _top_k(value: int | None) -> int:
    # vLLM's clients send -1 for "off"; ours is 0.
    return 0 if value is None or value == -1 else value


def _aliased_roles(messages: Any) -> Any:
    if not isinstance(messages, list):
        return messages  # messages_from_openai names the problem
    return [{**m, "role": _ROLE_ALIASES[m["role"]]} if _aliased(m) else m for m in messages]


def _aliased(message: Any) -> bool:
    # A role may be any JSON value here (a list is unhashable): only a string is looked up; messages_from_openai
    # names whatever else it is.
    return isinstance(message, Mapping) and isinstance(message.get("role"), str) and message["role"] in _ROLE_ALIASES


def _load_audio(raw: bytes, fmt: str, field: str) -> Any:
    from vidloom.media.audio_upload import load_input_audio  # PyAV only when audio arrives

    return load_input_audio(raw, fmt, field)


def _load_video(raw: bytes, field: str, with_audio: bool) -> Any:
    from vidloom.media.chat_video import load_chat_video  # PyAV only when a video arrives

    return load_chat_video(raw, field, with_audio)


def _load_image(raw: Any, field: str) -> Any:
    from vidloom.media.image import load_image  # PIL only when an image arrives

    if not isinstance(raw, (bytes, bytearray)):  # never a path: a client string must not open server files
        raise InvalidRequest(field, "must be image bytes")
    return load_image(bytes(raw), field)
