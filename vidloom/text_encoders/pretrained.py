"""Reading an encoder's folders through transformers: a failure is a CheckpointError naming the folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from safetensors import SafetensorError

from vidloom.core.errors import CheckpointError


def load_tokenizer(folder: Path) -> Any:
    """The folder's tokenizer (AutoTokenizer)."""
    from transformers import AutoTokenizer

    return load_pretrained(AutoTokenizer, folder, "tokenizer", errors=(OSError, ValueError))


def load_pretrained(cls: Any, folder: Path, what: str, *, errors: tuple[type[Exception], ...] = (
        OSError, ValueError, SafetensorError), **kwargs: Any) -> Any:
    """`cls.from_pretrained(folder, **kwargs)`; `errors` (a truncated weights file is a SafetensorError) become a
    CheckpointError saying it cannot load `what`."""
    try:
        return cls.from_pretrained(str(folder), **kwargs)
    except errors as exc:
        raise CheckpointError(f"{folder}: cannot load {what} ({exc})") from None
