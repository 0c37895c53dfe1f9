"""Wan prompt encoding: UMT5 encoder (transformers) + the checkpoint's tokenizer (Wan and AnyFlow-FAR).

Matches diffusers' WanPipeline prompt handling: unescape HTML twice and collapse
whitespace, pad/trim to `max_length` tokens, encode with the attention mask, then
zero every position past each prompt's real length.
"""

from __future__ import annotations

import contextlib
import html
import re
import threading
import warnings
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase, UMT5EncoderModel

from vidloom.core.request import GenerationRequest
from vidloom.text_encoders.offloaded_weights import hold, uploaded
from vidloom.text_encoders.pretrained import load_pretrained, load_tokenizer
from vidloom.text_encoders.prompt_cache import EmbeddingCache

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


def encode_prompt_pair(
    text: WanTextEncoder, prompt: str, negative: str | None, uses_cfg: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Prompt and negative-prompt embeddings (None without CFG), both prompts in one encoder call."""
    if not uses_cfg:
        return text.encode([prompt]), None
    both = text.encode([prompt, negative or ""])
    return both[:1], both[1:]


def encode_request_prompts(text: WanTextEncoder, request: GenerationRequest) -> dict[str, torch.Tensor | None]:
    """Slots "prompt_embeds" and "negative_embeds" of a request."""
    prompt_embeds, negative_embeds = encode_prompt_pair(text, request.prompt, request.negative_prompt, request.uses_cfg)
    return {"prompt_embeds": prompt_embeds, "negative_embeds": negative_embeds}


class WanTextEncoder:
    """Turns prompts into [batch, max_length, dim] embeddings on `device`.

    Shared by every request. Two memory options: `offload` keeps the UMT5 weights in
    CPU memory and moves them to `device` only while encoding; `cache_size` > 0 keeps
    that many recent prompt embeddings (keyed by a hash of the cleaned prompt), so a
    repeated prompt or negative prompt skips the encoder entirely.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        model: UMT5EncoderModel,
        device: torch.device,
        *,
        max_length: int = WAN_TEXT_TOKENS,
        offload: bool = False,
        cache_size: int = 0,
    ) -> None:
        self.tokenizer = tokenizer
        self.device = device
        self.model, self._offloaded = hold(model, device, offload)
        self.max_length = max_length
        self.cache = EmbeddingCache(cache_size)
        self._encoder_lock = threading.Lock()  # offload moves weights: one encode at a time

    @classmethod
    def load(
        cls, tokenizer_dir: Path, encoder_dir: Path, device: torch.device, dtype: torch.dtype, **options: Any
    ) -> "WanTextEncoder":
        tokenizer = load_tokenizer(tokenizer_dir)
        model = load_pretrained(UMT5EncoderModel, encoder_dir, "UMT5 text encoder", dtype=dtype)
        return cls(tokenizer, model, device, **options)

    def encode(self, prompts: list[str]) -> torch.Tensor:
        """[len(prompts), max_length, dim] on `device`; cached prompts are not re-encoded."""
        cleaned = [clean_prompt(p) for p in prompts]
        return torch.stack(self.cache.embed(cleaned, self._run_encoder)).to(self.device)

    @torch.inference_mode()
    def _run_encoder(self, texts: list[str]) -> torch.Tensor:
        self._warn_if_truncated(texts)
        tokens = self.tokenizer(
            texts,
            padding="max_length",
            max_length=self.max_length,
            truncation=True,
            add_special_tokens=True,
            return_attention_mask=True,
            return_tensors="pt",
        )
        with self._encoder_lock, self._on_device():
            ids, mask = tokens.input_ids.to(self.device), tokens.attention_mask.to(self.device)
            hidden = self.model(ids, mask).last_hidden_state
        # Positions past each prompt's length become exact zeros, as Wan was trained.
        past_end = torch.arange(hidden.shape[1], device=hidden.device)[None, :] >= mask.sum(dim=1)[:, None]
        return hidden.masked_fill(past_end[..., None], 0.0)

    def _on_device(self) -> contextlib.AbstractContextManager[None]:
        return uploaded(self._offloaded)

    def _warn_if_truncated(self, texts: list[str]) -> None:
        """Wan reads max_length tokens, as diffusers does; say so when a prompt is longer instead of cutting silently."""
        counts = self.tokenizer(texts, add_special_tokens=True, truncation=False, verbose=False)["input_ids"]
        for text, ids in zip(texts, counts):
            if len(ids) > self.max_length:
                preview = text if len(text) <= 40 else text[:37] + "..."
                warnings.warn(PromptTruncated(
                    f"prompt {preview!r} is {len(ids)} tokens; the text encoder reads the first {self.max_length} "
                    f"and ignores the other {len(ids) - self.max_length}"
                ), stacklevel=2)


class PromptTruncated(UserWarning):
    """A prompt longer than the text encoder's token limit was cut to the limit."""
