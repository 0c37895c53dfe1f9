"""Wan prompt encoding: UMT5 encoder (transformers) + the checkpoint's tokenizer.

Matches diffusers' WanPipeline prompt handling: unescape HTML twice and collapse
whitespace, pad/trim to `max_length` tokens, encode with the attention mask, then
zero every position past each prompt's real length.
"""

from __future__ import annotations

import html
import re
from pathlib import Path

import torch
from transformers import AutoTokenizer, PreTrainedTokenizerBase, UMT5EncoderModel

from vidloom.core.errors import CheckpointError

WAN_TEXT_TOKENS = 512  # text length Wan2.1 was trained with (diffusers' default max_sequence_length)

try:  # diffusers fixes mojibake with ftfy when it is installed; do the same so prompts match
    import ftfy
except ImportError:  # pragma: no cover - depends on the environment
    ftfy = None


def clean_prompt(text: str) -> str:
    if ftfy is not None:
        text = ftfy.fix_text(text)
    text = html.unescape(html.unescape(text)).strip()
    return re.sub(r"\s+", " ", text).strip()


class WanTextEncoder:
    """Turns prompts into [batch, max_length, dim] embeddings; shared, holds no per-call state."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, model: UMT5EncoderModel, max_length: int = WAN_TEXT_TOKENS):
        self.tokenizer = tokenizer
        self.model = model.eval()
        self.max_length = max_length

    @classmethod
    def load(cls, tokenizer_dir: Path, encoder_dir: Path, device: torch.device, dtype: torch.dtype) -> "WanTextEncoder":
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"{tokenizer_dir}: cannot load tokenizer ({exc})") from None
        try:
            model = UMT5EncoderModel.from_pretrained(str(encoder_dir), dtype=dtype)
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"{encoder_dir}: cannot load UMT5 text encoder ({exc})") from None
        return cls(tokenizer, model.to(device))

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @torch.inference_mode()
    def encode(self, prompts: list[str]) -> torch.Tensor:
        tokens = self.tokenizer(
            [clean_prompt(p) for p in prompts],
            padding="max_length",
            max_length=self.max_length,
            truncation=True,
            add_special_tokens=True,
            return_attention_mask=True,
            return_tensors="pt",
        )
        ids, mask = tokens.input_ids.to(self.device), tokens.attention_mask.to(self.device)
        hidden = self.model(ids, mask).last_hidden_state
        # Positions past each prompt's length become exact zeros, as Wan was trained.
        past_end = torch.arange(hidden.shape[1], device=hidden.device)[None, :] >= mask.sum(dim=1)[:, None]
        return hidden.masked_fill(past_end[..., None], 0.0)
