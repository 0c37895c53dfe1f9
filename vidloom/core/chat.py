"""Chat (AR decode) contracts: messages, sampling parameters, streamed deltas and the final result.

Shared by the runtime (vidloom.runtime.chat_stream), the Python API (VideoGenerator.chat), the CLI and the
OpenAI-compatible server. Validation raises InvalidRequest naming the request field
("messages[1].role", "temperature", "max_tokens"), so every front end reports bad input alike.
"""

from __future__ import annotations

import base64
import binascii
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from vidloom.core.errors import InvalidRequest, LimitExceeded
from vidloom.core.request_checks import MAX_SEED  # the same number rules as generation requests
from vidloom.core.request_checks import check_float as _check_float
from vidloom.core.request_checks import check_int as _check_int
from vidloom.core.request_checks import shown

if TYPE_CHECKING:
    from PIL import Image

ROLES = ("system", "user", "assistant")
PART_TYPES = ("text", "image", "audio", "video")
MAX_TEMPERATURE = 2.0  # OpenAI's range; past it sampling is near-uniform noise
# Temperatures below this decode greedily (vLLM's _SAMPLING_EPS): dividing logits by 5e-324 (0 in float32)
# gives inf/NaN probabilities, and anything this small already puts all the mass on the top token.
MIN_TEMPERATURE = 1e-5
MAX_TOP_K = 1 << 20  # larger than any vocabulary; a bigger value is a typo


@dataclass(frozen=True)
class ChatLimits:
    """Bounds on one chat request, from the card and the deployment; each names the field it bounds."""

    context_window: int  # prompt + completion tokens the model attends to (max_model_len)
    max_tokens: int  # most completion tokens one request may ask for
    default_max_tokens: int  # completion tokens when the request gives no max_tokens (capped by the window)
    max_stop: int = 4  # stop strings per request (OpenAI's limit)
    max_stop_chars: int = 256  # characters per stop string
    max_prompt_chars: int = 1 << 20  # characters of message text, all messages together

    def __post_init__(self) -> None:
        for name in ("context_window", "max_tokens", "default_max_tokens", "max_stop", "max_stop_chars",
                     "max_prompt_chars"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}: must be an integer >= 1, got {value!r}")


@dataclass(frozen=True)
class ChatPart:
    """One piece of a message's content."""

    type: str  # "text" | "image" | "audio" | "video"
    text: str = ""
    image: Image.Image | None = None  # RGB, loaded at the boundary (media.image.load_image)
    audio: Any = None  # float32 mono samples [n], decoded at the boundary (media.audio_upload.load_input_audio)
    sample_rate: int = 0  # the audio's
    video: Any = None  # media.chat_video.ChatVideo: checked at the boundary, its frames decoded when sampled


@dataclass(frozen=True)
class ChatMessage:
    role: str  # "system" | "user" | "assistant"
    content: tuple[ChatPart, ...]

    @property
    def text(self) -> str:
        """The message's text parts joined (what a text-only template renders)."""
        return "".join(p.text for p in self.content if p.type == "text")


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens; temperature 0 (or below MIN_TEMPERATURE) is greedy."""

    max_tokens: int | None = None  # None: limits.default_max_tokens, capped by what is left of the window
    temperature: float = 1.0  # 0 (anything below MIN_TEMPERATURE) = greedy
    top_p: float = 1.0  # (0, 1]
    top_k: int = 0  # 0 = off
    seed: int | None = None
    stop: tuple[str, ...] = ()

    @property
    def greedy(self) -> bool:
        return self.temperature < MIN_TEMPERATURE

    def validate(self, limits: ChatLimits | None = None) -> None:
        """Raise InvalidRequest naming the first bad field; `limits` bounds max_tokens and stop."""
        if self.max_tokens is not None:
            _check_int("max_tokens", self.max_tokens, 1)
            if limits is not None and self.max_tokens > limits.max_tokens:
                raise LimitExceeded("max_tokens", f"{self.max_tokens} is more than the limit of {limits.max_tokens} "
                                                  "(max_tokens)", "max_tokens")
        _check_float("temperature", self.temperature, minimum=0.0, maximum=MAX_TEMPERATURE, open_min=False)
        _check_float("top_p", self.top_p, minimum=0.0, maximum=1.0, open_min=True)
        _check_int("top_k", self.top_k, 0, MAX_TOP_K)
        if self.seed is not None:
            _check_int("seed", self.seed, 0, MAX_SEED)
        self._check_stop(limits)

    def _check_stop(self, limits: ChatLimits | None) -> None:
        if not isinstance(self.stop, tuple):
            raise InvalidRequest("stop", f"must be a tuple of strings, got {type(self.stop).__name__}")
        if limits is not None and len(self.stop) > limits.max_stop:
            raise LimitExceeded("stop", f"{len(self.stop)} stop strings is more than the limit of {limits.max_stop} "
                                        "(max_stop)", "max_stop")
        for i, s in enumerate(self.stop):
            if not isinstance(s, str) or not s:
                raise InvalidRequest(f"stop[{i}]", f"must be a non-empty string, got {s!r}")
            if limits is not None and len(s) > limits.max_stop_chars:
                raise LimitExceeded(f"stop[{i}]", f"{len(s)} characters is more than the limit of "
                                                  f"{limits.max_stop_chars} (max_stop_chars)", "max_stop_chars")

    def completion_budget(self, prompt_tokens: int, limits: ChatLimits) -> int:
        """Completion tokens this request may produce after a prompt of `prompt_tokens` tokens.

        InvalidRequest when the prompt leaves no room, or max_tokens asks for more than the window has left.
        """
        room = limits.context_window - prompt_tokens
        if room < 1:
            raise LimitExceeded("messages", f"the prompt is {prompt_tokens} tokens, which leaves no room in the "
                                            f"context window of {limits.context_window} tokens", "context_window")
        if self.max_tokens is None:
            return min(limits.default_max_tokens, room)
        if self.max_tokens > room:
            raise LimitExceeded("max_tokens", f"{self.max_tokens} plus the prompt's {prompt_tokens} tokens is more "
                                              f"than the context window of {limits.context_window} tokens",
                                "context_window")
        return self.max_tokens


def _new_request_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


@dataclass(frozen=True)
class ChatRequest:
    """One chat completion call."""

    messages: tuple[ChatMessage, ...]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    request_id: str = field(default_factory=_new_request_id)

    def validate(self, limits: ChatLimits | None = None) -> None:
        """Raise InvalidRequest naming the first bad field (messages[i].role, temperature, ...)."""
        validate_messages(self.messages, limits)
        self.sampling.validate(limits)


@dataclass(frozen=True)
class TokenDelta:
    """Streamed per decode step; `text` may be "" while a multi-byte character or a stop string is pending."""

    request_id: str
    text: str
    token_ids: tuple[int, ...]


@dataclass(frozen=True)
class ChatResult:
    """The last item of every chat stream."""

    request_id: str
    text: str
    finish_reason: str  # "stop" | "length" (| "cancelled" internally, never sent to a client as a success)
    prompt_tokens: int
    completion_tokens: int
    time_to_first_token_s: float
    token_ids: tuple[int, ...] = ()  # the completion's token ids (tests, the CLI's --show-ids)


def validate_messages(messages: object, limits: ChatLimits | None = None) -> None:
    """Raise InvalidRequest naming the first bad message field."""
    if not isinstance(messages, tuple) or not messages:
        raise InvalidRequest("messages", "must be a non-empty list of messages")
    chars = 0
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, ChatMessage):
            raise InvalidRequest(where, f"must be a ChatMessage, got {type(message).__name__}")
        if message.role not in ROLES:
            raise InvalidRequest(f"{where}.role", f"unknown role {message.role!r}; known: {', '.join(ROLES)}")
        if not isinstance(message.content, tuple):
            raise InvalidRequest(f"{where}.content", "must be a tuple of ChatPart")
        for j, part in enumerate(message.content):
            chars += _check_part(part, f"{where}.content[{j}]", message.role)
    if limits is not None and chars > limits.max_prompt_chars:
        raise LimitExceeded("messages", f"{chars} characters of text is more than the limit of "
                                        f"{limits.max_prompt_chars} (max_prompt_chars)", "max_prompt_chars")


def _check_part(part: object, where: str, role: str) -> int:
    if not isinstance(part, ChatPart):
        raise InvalidRequest(where, f"must be a ChatPart, got {type(part).__name__}")
    if part.type not in PART_TYPES:
        raise InvalidRequest(f"{where}.type", f"unknown part type {part.type!r}; known: {', '.join(PART_TYPES)}")
    if part.type == "audio":
        samples = part.audio
        if getattr(samples, "ndim", None) != 1 or getattr(samples, "dtype", None) is None or \
                samples.dtype.kind != "f" or samples.shape[0] < 1:
            raise InvalidRequest(f"{where}.audio", "an audio part needs float samples [n] (mono)")
        if not isinstance(part.sample_rate, int) or part.sample_rate < 1:
            raise InvalidRequest(f"{where}.sample_rate", f"must be a positive integer, got {part.sample_rate!r}")
        if role != "user":
            raise InvalidRequest(f"{where}.type", f"audio is accepted in user messages only, not {role!r}")
        return 0
    if part.type in ("image", "video"):
        article = "an" if part.type == "image" else "a"
        if getattr(part, part.type) is None:
            raise InvalidRequest(f"{where}.{part.type}", f"{article} {part.type} part needs {article} {part.type}")
        if role != "user":
            raise InvalidRequest(f"{where}.type", f"{part.type}s are accepted in user messages only, not {role!r}")
        return 0
    if not isinstance(part.text, str):
        raise InvalidRequest(f"{where}.text", f"must be a string, got {type(part.text).__name__}")
    try:
        part.text.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate: no tokenizer takes it
        raise InvalidRequest(f"{where}.text", f"is not valid Unicode (unpaired surrogate at {exc.start})") from None
    return len(part.text)


ImageLoader = Callable[[Any, str], "Image.Image"]
"""(value, field) -> RGB image; media.image.load_image (raises InvalidRequest naming the field)."""
AudioLoader = Callable[[bytes, str, str], Any]
"""(file bytes, format, field) -> float32 mono samples at INPUT_AUDIO_RATE; media.audio_upload.load_input_audio."""
INPUT_AUDIO_RATE = 16000  # the rate AudioLoader decodes to (media.audio_upload.INPUT_AUDIO_RATE)
VideoLoader = Callable[[bytes, str, bool], Any]
"""(file bytes, field, with its sound track) -> media.chat_video.ChatVideo; media.chat_video.load_chat_video."""
VIDEO_URL_KEYS = frozenset({"url", "use_audio_in_video"})


def messages_from_openai(messages: object, load_image: ImageLoader | None = None,
                         load_audio: AudioLoader | None = None,
                         load_video: VideoLoader | None = None) -> tuple[ChatMessage, ...]:
    """ChatMessages from OpenAI-style dicts ({"role", "content": str | [parts]}) or ChatMessages.

    Image parts ({"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}) are decoded with
    `load_image`; remote URLs are refused (the server fetches nothing on a caller's behalf). Audio parts
    ({"type": "input_audio", "input_audio": {"data": base64, "format": "wav" | "mp3"}}) with `load_audio`. Video
    parts ({"type": "video_url", "video_url": {"url": "data:video/mp4;base64,...", "use_audio_in_video": bool}})
    with `load_video`; use_audio_in_video (default false) also reads the file's sound track.
    """
    if not isinstance(messages, (list, tuple)) or not messages:
        raise InvalidRequest("messages", "must be a non-empty list of messages")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if isinstance(m, ChatMessage):
            out.append(m)
            continue
        if not isinstance(m, Mapping):
            raise InvalidRequest(where, f"must be an object with role and content, got {type(m).__name__}")
        role = m.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise InvalidRequest(f"{where}.role", f"unknown role {role!r}; known: {', '.join(ROLES)}")
        out.append(ChatMessage(role, _content_from_openai(m.get("content"), f"{where}.content", load_image,
                                                          load_audio, load_video)))
    return tuple(out)


def _content_from_openai(content: object, where: str, load_image: ImageLoader | None,
                         load_audio: AudioLoader | None = None,
                         load_video: VideoLoader | None = None) -> tuple[ChatPart, ...]:
    if isinstance(content, str):
        return (ChatPart("text", text=content),)
    if not isinstance(content, (list, tuple)):
        raise InvalidRequest(where, f"must be a string or a list of content parts, got {type(content).__name__}")
    if not content:
        raise InvalidRequest(where, "is an empty list; give at least one content part")
    parts = []
    for j, part in enumerate(content):
        at = f"{where}[{j}]"
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind == "text" and isinstance(part.get("text"), str):
            parts.append(ChatPart("text", text=part["text"]))
        elif kind == "image_url":
            parts.append(ChatPart("image", image=_image_from_openai(part.get("image_url"), at, load_image)))
        elif kind == "input_audio":
            samples = _audio_from_openai(part.get("input_audio"), at, load_audio)
            parts.append(ChatPart("audio", audio=samples, sample_rate=INPUT_AUDIO_RATE))
        elif kind == "video_url":
            parts.append(ChatPart("video", video=_video_from_openai(part.get("video_url"), at, load_video)))
        else:
            raise InvalidRequest(at, "must be {'type': 'text', 'text': str}, {'type': 'image_url', ...}, "
                                     "{'type': 'input_audio', ...} or {'type': 'video_url', ...}")
    return tuple(parts)


def _audio_from_openai(spec: object, where: str, load_audio: AudioLoader | None) -> Any:
    field = f"{where}.input_audio"
    if not isinstance(spec, Mapping) or not isinstance(spec.get("data"), str) or \
            not isinstance(spec.get("format"), str):
        raise InvalidRequest(field, "must be {'data': base64 str, 'format': 'wav' | 'mp3'}")
    unknown = sorted(set(spec) - {"data", "format"}, key=str)
    if unknown:
        raise InvalidRequest(field, f"takes only data and format, not {shown(unknown[0])}")
    if load_audio is None:
        raise InvalidRequest(where, "this model does not accept audio")
    try:
        raw = base64.b64decode(spec["data"], validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest(f"{field}.data", "is not valid base64") from None
    return load_audio(raw, spec["format"], field)


def _image_from_openai(spec: object, where: str, load_image: ImageLoader | None) -> Image.Image:
    url = spec.get("url") if isinstance(spec, Mapping) else spec
    if not isinstance(url, str):
        raise InvalidRequest(f"{where}.image_url", "must be {'url': 'data:image/...;base64,...'}")
    if load_image is None:
        raise InvalidRequest(where, "this model does not accept images")
    return load_image(_data_url(url, f"{where}.image_url"), f"{where}.image_url")


def _video_from_openai(spec: object, where: str, load_video: VideoLoader | None) -> Any:
    field = f"{where}.video_url"
    url = spec.get("url") if isinstance(spec, Mapping) else spec
    if not isinstance(url, str):
        raise InvalidRequest(field, "must be {'url': 'data:video/mp4;base64,...', 'use_audio_in_video': bool}")
    with_audio = spec.get("use_audio_in_video", False) if isinstance(spec, Mapping) else False
    if isinstance(spec, Mapping):
        unknown = sorted(set(spec) - VIDEO_URL_KEYS, key=str)
        if unknown:
            raise InvalidRequest(field, f"takes only url and use_audio_in_video, not {shown(unknown[0])}")
    if not isinstance(with_audio, bool):
        raise InvalidRequest(f"{field}.use_audio_in_video", f"must be true or false, got {with_audio!r}")
    if load_video is None:
        raise InvalidRequest(where, "this model does not accept videos")
    return load_video(_data_url(url, field), field, with_audio)


def _data_url(url: str, field: str) -> bytes:
    """A base64 data: URL's bytes; remote URLs are refused (the server fetches nothing on a caller's behalf)."""
    if not url.startswith("data:"):
        raise InvalidRequest(field, "only data: URLs (base64) are accepted; remote URLs are not fetched")
    header, _, payload = url.partition(",")
    if ";base64" not in header:
        raise InvalidRequest(field, "a data: URL must be base64-encoded")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest(field, "is not valid base64") from None


def stop_tuple(stop: str | Sequence[str] | None) -> tuple[str, ...]:
    """OpenAI's `stop` (a string, a list or None) as a tuple."""
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,)
    if isinstance(stop, (list, tuple)):
        return tuple(stop)
    raise InvalidRequest("stop", f"must be a string or a list of strings, got {type(stop).__name__}")


def build_chat_request(messages: object, *, load_image: ImageLoader | None = None,
                       load_audio: AudioLoader | None = None, load_video: VideoLoader | None = None,
                       request_id: str | None = None,
                       max_tokens: int | None = None, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
                       seed: int | None = None, stop: str | Sequence[str] | None = None) -> ChatRequest:
    """A ChatRequest from OpenAI-style messages (dicts or ChatMessages) and sampling keywords (not yet validated)."""
    sampling = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed,
                              stop=stop_tuple(stop))
    converted = messages_from_openai(messages, load_image, load_audio, load_video)
    return ChatRequest(converted, sampling) if request_id is None else ChatRequest(converted, sampling, request_id)
