"""A chat's media parts sized from their headers before any of them is decoded, and admitted against two limits.

Decoding a chat's audio and images, then their features, is the costly part of planning it (a 767 KB body of
twenty 29 s MP3 parts decodes to 580 s of audio), so it is admitted first, from what the files' headers say:

- one chat's decoded media (max_chat_media_bytes): more is a 400 naming `messages`, as it can never run;
- every chat being decoded and prepared at once (chat_media_budget_bytes): past it a 429 (`media_busy`,
  Retry-After), refused before the decode rather than after it, when the KV pool turns the prompt away.

What a part decodes to: audio as the float32 mono samples load_input_audio holds at 16 kHz (the header's
duration x rate), an image as its 8-bit RGB pixels (the header's width x height x 3), a video as its sampled
frames and sound track (media.chat_video.sampled_bytes).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import itertools
from typing import Any, Iterator, Mapping

from vidloom.core.errors import InvalidRequest, LimitExceeded
from vidloom.core.limits import format_bytes
from vidloom.runtime.admission import MemoryAdmission
from vidloom.serving.errors import APIError

AUDIO_SAMPLE_BYTES = 4  # float32, one channel (load_input_audio mixes down as it decodes)
IMAGE_PIXEL_BYTES = 3  # RGB, 8 bits each (load_image converts to RGB)
MEDIA_RETRY_AFTER_S = 2  # a chat's media are held only while it is decoded and prepared


def chat_media_bytes(messages: object) -> int:
    """Bytes a chat's media parts decode to, from their headers alone; InvalidRequest naming a part whose file
    is not what it says (as planning would)."""
    from vidloom.media.audio_upload import INPUT_AUDIO_RATE, input_audio_seconds

    total = 0
    for where, kind, spec in _media_parts(messages):
        if kind == "input_audio":
            if not isinstance(spec, Mapping):
                continue  # planning names the malformed part
            data = _base64(spec.get("data"), f"{where}.input_audio.data")
            fmt = spec.get("format")
            if data is None or not isinstance(fmt, str):
                continue  # planning names the malformed part
            seconds = input_audio_seconds(data, fmt, f"{where}.input_audio") or 0.0
            total += int(seconds * INPUT_AUDIO_RATE) * AUDIO_SAMPLE_BYTES
        else:
            url = spec.get("url") if isinstance(spec, Mapping) else spec
            payload = url.partition(",")[2] if isinstance(url, str) and url.startswith("data:") else None
            data = _base64(payload, f"{where}.{kind}")
            if data is not None and kind == "video_url":
                total += _video_bytes(data, f"{where}.{kind}", isinstance(spec, Mapping) and
                                      spec.get("use_audio_in_video") is True)
            elif data is not None:
                width, height = _image_size(data, f"{where}.image_url")
                total += width * height * IMAGE_PIXEL_BYTES
    return total


class ChatMediaAdmission:
    """The decoded media of the chats being planned and prepared, held against `budget_bytes`; each chat's
    alone against `per_chat_bytes`. Thread-safe (MemoryAdmission's ledger)."""

    def __init__(self, per_chat_bytes: int, budget_bytes: int) -> None:
        self.per_chat_bytes = per_chat_bytes
        self.ledger = MemoryAdmission(budget_bytes)
        self._ids = itertools.count()

    @contextlib.contextmanager
    def admitted(self, nbytes: int) -> Iterator[None]:
        """Hold `nbytes` for the block's duration; LimitExceeded (400) or APIError 429 before it runs."""
        if nbytes > self.per_chat_bytes:
            raise LimitExceeded("messages", f"media parts decode to {format_bytes(nbytes)} (from their headers), more "
                                            f"than the {format_bytes(self.per_chat_bytes)} one chat may hold "
                                            "(max_chat_media_bytes)",
                                "max_chat_media_bytes")
        owner = next(self._ids)
        if not self.ledger.try_reserve(owner, nbytes, "chat media"):
            free = max(0, (self.ledger.budget_bytes or 0) - self.ledger.in_use)
            raise APIError(429, f"the chats being prepared hold their media's memory: this one needs "
                                f"{format_bytes(nbytes)} and {format_bytes(free)} of the "
                                f"{format_bytes(self.ledger.budget_bytes or 0)} (chat_media_budget_bytes) are free; "
                                "retry shortly", code="media_busy", headers={"Retry-After": str(MEDIA_RETRY_AFTER_S)})
        try:
            yield
        finally:
            self.ledger.release(owner)


def _media_parts(messages: object) -> Iterator[tuple[str, str, Any]]:
    """(where, "input_audio" | "image_url" | "video_url", its spec) for each media part of OpenAI-style messages."""
    for i, message in enumerate(messages if isinstance(messages, list) else ()):
        content = message.get("content") if isinstance(message, Mapping) else None
        for j, part in enumerate(content if isinstance(content, list) else ()):
            kind = part.get("type") if isinstance(part, Mapping) else None
            if kind in ("input_audio", "image_url", "video_url") and isinstance(part.get(kind), (Mapping, str)):
                yield f"messages[{i}].content[{j}]", kind, part[kind]


def _base64(value: object, field: str) -> bytes | None:
    if not isinstance(value, str):
        return None
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest(field, "is not valid base64") from None


def _video_bytes(data: bytes, field: str, with_audio: bool) -> int:
    from vidloom.media.chat_video import chat_video_header, sampled_bytes  # PyAV only when a video arrives

    return sampled_bytes(*chat_video_header(data, field), with_audio)


def _image_size(data: bytes, field: str) -> tuple[int, int]:
    from vidloom.media.image import open_image  # the header alone: no pixel is decoded

    return open_image(data, field).size
