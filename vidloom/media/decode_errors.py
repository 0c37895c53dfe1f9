"""A decoder's error as a client may read it: the reason, without the server file or the object it names.

FFmpeg (PyAV) and the OS name the file they failed on (an upload's temporary copy, `/tmp/vidloom-upload-.../
input.wav`); PIL names the buffer it read (`<_io.BytesIO object at 0x7f...>`). Neither belongs in an error a
client sees: the field the upload came in already says which input it was.
"""

from __future__ import annotations

import re
from pathlib import Path

_OBJECT_REPR = re.compile(r"\s*<[^<>]* at 0x[0-9a-fA-F]+>")


def decode_reason(exc: BaseException, path: Path | None = None) -> str:
    """The reason an upload could not be read: an OSError's (FFmpeg's) strerror, else its text less object reprs
    and less `path` (a reader's own message that starts with the file it read)."""
    strerror = getattr(exc, "strerror", None)
    text = strerror if isinstance(strerror, str) and strerror else str(exc)
    if path is not None:
        text = text.replace(f"{path}: ", "").replace(str(path), path.name)
    return strip_object_reprs(text).strip() or type(exc).__name__


def strip_object_reprs(text: str) -> str:
    """`text` without default object reprs (`<_io.BytesIO object at 0x7f...>`): an address says nothing to a client."""
    return _OBJECT_REPR.sub("", text)
