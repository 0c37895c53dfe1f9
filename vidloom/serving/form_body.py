"""Multipart form bodies, parsed strictly: text must decode in its charset, fields and files are counted.

Starlette's parser decodes a text part that is not valid UTF-8 as latin-1 (so b"\\xff\\xfe" is stored as
"ÿþ", and an encoded surrogate as mojibake) and reports too many fields as a bare HTTPException. Here a
text part or field name that does not decode is a 400 naming the field, as a lone surrogate in JSON is,
and every structural refusal is a 400 `invalid_form` / `limit_exceeded` in the OpenAI error shape.
"""

from __future__ import annotations

import codecs
import math
from contextlib import aclosing
from typing import AsyncGenerator

from fastapi import Request
from starlette.datastructures import FormData, Headers
from starlette.formparsers import MultiPartException, MultiPartParser, parse_options_header

from vidloom.serving.errors import APIError

# Text fields one form may carry: the widest body (POST /v1/videos) has 21 fields, so a form with more is
# not a request (starlette's default, 1000, lets one body make a thousand parts).
MAX_FORM_FIELDS = 64
# File parts one form may carry when a route does not say (videos: input_reference, last_image, video).
MAX_FORM_FILES = 8


class _FormRefusal(MultiPartException):
    """Raised from a parser callback; carries the APIError the route answers with."""

    def __init__(self, error: APIError) -> None:
        super().__init__(error.message)
        self.error = error


class StrictMultiPartParser(MultiPartParser):
    """Starlette's multipart parser with strict text decoding and counted fields/files (limits named)."""

    def __init__(self, headers: Headers, stream: AsyncGenerator[bytes, None], charset: str, max_fields: int,
                 max_files: int) -> None:
        # Starlette's own counters stay unlimited: ours raise with the setting's name instead.
        super().__init__(headers, stream, max_files=math.inf, max_fields=math.inf)
        self.strict_charset = charset
        self.field_limit = max_fields
        self.file_limit = max_files

    def on_headers_finished(self) -> None:
        _, options = parse_options_header(self._current_part.content_disposition)
        if b"name" in options:
            _decode(options[b"name"], self.strict_charset, "form field name")
        super().on_headers_finished()
        if self._current_fields > self.field_limit:
            raise _FormRefusal(APIError(
                400, f"the form has more than {self.field_limit} text fields (max_form_fields)",
                code="limit_exceeded"))
        if self._current_files > self.file_limit:
            raise _FormRefusal(APIError(
                400, f"the form has more than {self.file_limit} file parts (max_form_files)", code="limit_exceeded"))

    def on_part_end(self) -> None:
        part = self._current_part
        if part.file is None:
            self.items.append((part.field_name, _decode(part.data, self.strict_charset, part.field_name)))
        else:
            super().on_part_end()


def _decode(raw: bytes | bytearray, charset: str, field: str) -> str:
    try:
        return bytes(raw).decode(charset)
    except UnicodeDecodeError as exc:  # also an encoded lone surrogate: UTF-8 and UTF-16 decoders refuse them
        shown = field if field == "form field name" else field[:64]
        raise _FormRefusal(APIError(
            400, f"{shown}: is not valid {charset} text (byte {exc.start}); send valid Unicode text",
            param=None if field == "form field name" else shown, code="invalid_parameter")) from None


def form_charset(content_type: str) -> str:
    """The declared charset of a multipart body (UTF-8 when none); an unknown one is a 400."""
    _, params = parse_options_header(content_type)
    declared = params.get(b"charset", b"utf-8")
    name = declared.decode("latin-1") if isinstance(declared, bytes) else declared
    try:
        return codecs.lookup(name).name
    except LookupError:
        raise APIError(400, f"malformed form body: unknown charset {name[:32]!r}", code="invalid_form") from None


async def read_form(request: Request, *, max_fields: int = MAX_FORM_FIELDS, max_files: int = MAX_FORM_FILES) -> FormData:
    """The form of a multipart request; every refusal an APIError 400 in the OpenAI shape."""
    content_type = request.headers.get("content-type", "")
    if content_type.split(";")[0].strip().lower() != "multipart/form-data":
        raise APIError(400, "send multipart/form-data or application/json", code="unsupported_content_type")
    charset = form_charset(content_type)
    try:
        async with aclosing(request.stream()) as stream:
            return await StrictMultiPartParser(request.headers, stream, charset, max_fields, max_files).parse()
    except _FormRefusal as exc:
        raise exc.error from None
    except (MultiPartException, ValueError) as exc:
        raise APIError(400, f"malformed form body: {getattr(exc, 'message', exc)}", code="invalid_form") from None
