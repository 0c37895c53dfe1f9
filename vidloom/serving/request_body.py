"""Request bodies: a size limit enforced before any parsing, then JSON or a form into a pydantic model."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Callable, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError
from starlette.datastructures import UploadFile
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from vidloom.serving.errors import APIError, count_rejection, error_response, validation_error
from vidloom.serving.form_body import read_form

M = TypeVar("M", bound=BaseModel)
_DRAIN_FACTOR = 4  # read (and drop) up to this many times the limit so the client sees our 413, not a reset
# Form fields that may be file parts (bytes); init_audio: POST /v1/audio/generations' initial waveform.
FILE_FIELDS = frozenset({"input_reference", "last_image", "video", "init_audio"})


class BodyLimit:
    """ASGI middleware: buffers at most `max_bytes` of body within `timeout_s`, else answers 413 / 408
    without calling the app (a client dribbling its body cannot hold a connection for long)."""

    def __init__(self, app: ASGIApp, max_bytes: int, timeout_s: float = 30.0) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        size, more = 0, True
        declared = _content_length(scope)
        if declared is None or declared <= self.max_bytes:
            try:
                async with asyncio.timeout(self.timeout_s):
                    while more and size <= self.max_bytes:
                        message = await receive()
                        if message["type"] == "http.disconnect":
                            return
                        body = message.get("body", b"")
                        chunks.append(body)
                        size += len(body)
                        more = message.get("more_body", False)
            except TimeoutError:
                await self._refuse(scope, receive, send, 408, "request_timeout",
                                   f"the request body did not arrive within {self.timeout_s:g}s (body_timeout_s)")
                return
        if (declared is not None and declared > self.max_bytes) or size > self.max_bytes:
            await _drain(receive, more, limit=_DRAIN_FACTOR * self.max_bytes - size)
            await self._refuse(scope, receive, send, 413, "request_too_large",
                               f"request body is larger than this server's limit of {self.max_bytes} bytes")
            return
        await self.app(scope, _replay(b"".join(chunks), receive), send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, status: int, code: str, message: str) -> None:
        count_rejection(scope.get("app"), status, code)
        response = error_response(status, message, code=code, headers={"Connection": "close"})
        await response(scope, receive, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _drain(receive: Receive, more: bool, limit: int) -> None:
    drained = 0
    while more and drained < limit:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        drained += len(message.get("body", b""))
        more = message.get("more_body", False)


def _replay(body: bytes, receive: Receive) -> Receive:
    """Hand the buffered body to the app once, then the real channel (for disconnect notices)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


async def read_body(request: Request, model: type[M], before: Callable[[dict[str, Any]], None] | None = None) -> M:
    """Parse a JSON or multipart body into `model`; every failure is a 400 naming the field. `before` sees the
    parsed object first (and may refuse it)."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type == "multipart/form-data":  # RequestGuard refuses urlencoded bodies (415) before this
        data = await _form(request)
    elif content_type in ("", "application/json"):
        try:
            data = json.loads(await request.body())
        except (ValueError, UnicodeDecodeError):
            raise APIError(400, "request body is not valid JSON", code="invalid_json") from None
        except RecursionError:  # "[[[[..." nested deeper than the parser recurses
            raise APIError(400, "request body is nested too deeply", code="invalid_json") from None
    else:
        raise APIError(400, f"unsupported content type {content_type!r}; send application/json or a form",
                       code="unsupported_content_type")
    if not isinstance(data, dict):
        raise APIError(400, "request body must be a JSON object", code="invalid_json")
    if before is not None:
        before(data)
    return validate_fields(data, model)


def validate_fields(data: dict[str, Any], model: type[M]) -> M:
    """The one validator of JSON objects and forms alike (a form's values are its text and file bytes):
    text checks, then `model` (whose number and boolean types read a form's "8" / "true" as JSON's 8 / true)."""
    check_text_fields(data)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc) from None
    except RecursionError:
        raise APIError(400, "request body is nested too deeply", code="invalid_json") from None


def check_text_fields(data: dict[str, Any]) -> None:
    """APIError(400) naming the first field whose name or value holds a lone surrogate or a NUL (see _check_text);
    shared by HTTP bodies and WebSocket messages."""
    for key, value in data.items():
        _check_text(key, value)


def _check_text(key: object, value: object, depth: int = 0) -> None:
    """Every string in the body (JSON or form) must be storable text: a lone surrogate ("\\ud800") or a NUL
    (PostgreSQL text refuses it) is refused here, naming the field, so it never reaches the engine, the job
    store or a JSON response."""
    name = key if isinstance(key, str) and _text_problem(key) is None else "body"
    problem = _text_problem(key) or _text_problem(value)
    if problem is not None:
        raise APIError(400, f"{name}: {problem}; send valid Unicode text", param=name, code="invalid_parameter")
    if depth < 32 and isinstance(value, (list, dict)):  # deeper values are refused by the model's types anyway
        for item in value.values() if isinstance(value, dict) else value:
            _check_text(key, item, depth + 1)
        if isinstance(value, dict):
            for inner in value:
                _check_text(key, inner, depth + 1)


def _text_problem(value: object) -> str | None:
    if not isinstance(value, str):
        return None
    if "\x00" in value:
        return "contains a NUL character (U+0000)"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "contains an unpaired surrogate"
    return None


async def _form(request: Request) -> dict[str, Any]:
    form = await read_form(request)  # strict text decoding, counted fields: see form_body
    data: dict[str, Any] = {}
    for key, value in form.multi_items():
        if isinstance(value, UploadFile):
            if key not in FILE_FIELDS:
                raise APIError(400, f"{key}: must be a text field, not a file", param=key, code="invalid_parameter")
            value = await value.read()  # already in memory: BodyLimit buffered the whole body
        data[key] = value
    return data
