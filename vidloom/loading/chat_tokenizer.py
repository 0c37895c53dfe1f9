"""A checkpoint's own tokenizer with its chat template: what every chat decoder (Cosmos3, Qwen-Omni) reads prompts with."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vidloom.core.errors import CheckpointError


def load_chat_tokenizer(folder: Path) -> Any:
    """The checkpoint's own tokenizer and chat template, through transformers."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{folder}: cannot load the tokenizer ({exc})") from None
    if not getattr(tokenizer, "chat_template", None):
        raise CheckpointError(f"{folder}: the tokenizer has no chat template (tokenizer_config.json chat_template)")
    if tokenizer.eos_token_id is None:
        raise CheckpointError(f"{folder}: the tokenizer names no eos_token")
    return tokenizer
