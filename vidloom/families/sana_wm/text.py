"""SANA-WM's prompt path: Gemma-2 (through transformers), last hidden state, with SANA's instruction prefix.

The prompt is prefixed with the instruction ("chi") prompt SANA-WM was trained with, right-padded, and
the BOS token plus the last `max_tokens - 1` positions are kept (SanaWMPipeline.encode_prompt); the
negative prompt is encoded without the prefix. `offload` and `cache_size` (DeployConfig.offload_text_encoder,
prompt_cache_size) work as for every family's encoder (vidloom/text_encoders: OffloadedWeights, EmbeddingCache).
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from vidloom.layers.prompt_kv import PromptKV
from vidloom.text_encoders.offloaded_weights import hold, uploaded
from vidloom.text_encoders.pretrained import load_pretrained, load_tokenizer
from vidloom.text_encoders.prompt_cache import EmbeddingCache

# SanaWMPipeline's DEFAULT_CHI_PROMPT (diffusers 0.42, from SANA's training recipe): the model was trained
# on prompts carrying this prefix, so it is part of the conditioning, not a style choice.
CHI_PROMPT = "\n".join([
    'Given a user prompt, generate an "Enhanced prompt" that provides detailed visual descriptions suitable for '
    "image generation. Evaluate the level of detail in the user prompt:",
    "- If the prompt is simple, focus on adding specifics about colors, shapes, sizes, textures, and spatial "
    "relationships to create vivid and concrete scenes.",
    "- If the prompt is already detailed, refine and enhance the existing details slightly without "
    "overcomplicating.",
    "Here are examples of how to transform or refine prompts:",
    "- User Prompt: A cat sleeping -> Enhanced: A small, fluffy white cat curled up in a round shape, sleeping "
    "peacefully on a warm sunny windowsill, surrounded by pots of blooming red flowers.",
    "- User Prompt: A busy city street -> Enhanced: A bustling city street scene at dusk, featuring glowing "
    "street lamps, a diverse crowd of people in colorful clothing, and a double-decker bus passing by towering "
    "glass skyscrapers.",
    "Please generate only the enhanced description for the prompt below and avoid including any additional "
    "commentary or evaluations:",
    "User Prompt: ",
])
MAX_TEXT_TOKENS = 300  # SanaWMPipeline's max_sequence_length default


@dataclass(frozen=True)
class SanaWMText:
    embeds: Tensor  # [B, L, D] Gemma-2 last hidden states
    mask: Tensor  # [B, L] 1 = attend
    kv: PromptKV | None = None  # every block's cross-attention keys/values of these rows, once prepared

    def cat(self, other: SanaWMText) -> SanaWMText:
        return self._join([self, other], [slice(None)])

    def halves(self) -> tuple[SanaWMText, SanaWMText]:
        """A CFG batch [negatives..., positives...] (cat, stack) -> (negatives, positives)."""
        half = self.embeds.shape[0] // 2
        return self.rows(slice(None, half)), self.rows(slice(half, None))

    def rows(self, pick: slice) -> SanaWMText:
        return SanaWMText(self.embeds[pick], self.mask[pick], None if self.kv is None else self.kv.rows(pick))

    def batch_key(self) -> tuple[Any, ...]:
        """runtime.batching: texts of equal keys stack (prompts are padded to one length, so with CFG on for all
        or off for all they do; prepared keys/values stack with prepared ones)."""
        return (tuple(self.embeds.shape), self.embeds.dtype, self.embeds.device, self.mask.dtype,
                None if self.kv is None else self.kv.batch_key())

    @staticmethod
    def stack(texts: list[SanaWMText]) -> SanaWMText:
        """Requests' texts as one batch, branch by branch: with CFG [negatives..., positives...], the order
        loop.guided_prediction splits the stacked forward in."""
        return SanaWMText._join(texts, [slice(i, i + 1) for i in range(texts[0].embeds.shape[0])])

    @staticmethod
    def _join(texts: list[SanaWMText], picks: list[slice]) -> SanaWMText:
        """Every pick of every text, pick by pick."""
        parts = [t.rows(pick) for pick in picks for t in texts]
        kv = None if parts[0].kv is None else PromptKV.stack([p.kv for p in parts])  # type: ignore[misc]
        return SanaWMText(torch.cat([p.embeds for p in parts]), torch.cat([p.mask for p in parts]), kv)


class SanaWMTextEncoder:
    """Shared by every request; the encoder call is serialised. With `offload` (on an accelerator) the weights
    stay in host memory and are uploaded per encode; `cache_size` recent prompts are not encoded again."""

    def __init__(self, tokenizer: Any, model: Any, device: torch.device, max_tokens: int = MAX_TEXT_TOKENS, *,
                 offload: bool = False, cache_size: int = 0) -> None:
        self.tokenizer, self.device, self.max_tokens = tokenizer, device, max_tokens
        self.model, self._offloaded = hold(model, device, offload)
        self.cache = EmbeddingCache(cache_size)
        self._prefix_tokens = len(tokenizer.encode(CHI_PROMPT))
        self._lock = threading.Lock()

    @classmethod
    def load(cls, tokenizer_dir: Path, encoder_dir: Path, device: torch.device, dtype: torch.dtype,
             max_tokens: int = MAX_TEXT_TOKENS, **options: Any) -> SanaWMTextEncoder:
        tokenizer = load_tokenizer(tokenizer_dir)
        from transformers import AutoModel  # here: `vidloom models` reads this module's constants without it

        model = load_pretrained(AutoModel, encoder_dir, "the Gemma-2 text encoder", dtype=dtype)
        return cls(tokenizer, model, device, max_tokens, **options)

    @property
    def hidden_size(self) -> int:
        return int(self.model.config.hidden_size)

    def encode_prompt(self, prompt: str) -> SanaWMText:
        return self._cached("prompt", prompt, self._encode_prompt)

    def encode_negative(self, prompt: str) -> SanaWMText:
        return self._cached("negative", prompt, self._encode_negative)

    def _cached(self, kind: str, prompt: str, encode: Any) -> SanaWMText:
        # The prompt and the negative prompt are encoded differently (prefix, length): the kind is in the key.
        key = kind + ":" + hashlib.sha256(prompt.encode()).hexdigest()
        cached = self.cache.get(key)
        if cached is not None:
            return cached  # type: ignore[return-value]  # the cache holds SanaWMText values here
        text = encode(prompt)
        self.cache.put(key, text)  # type: ignore[arg-type]
        return text

    def _encode_prompt(self, prompt: str) -> SanaWMText:
        hidden, mask = self._hidden(CHI_PROMPT + prompt, self._prefix_tokens + self.max_tokens - 2)
        keep = [0, *range(-self.max_tokens + 1, 0)]  # BOS + the tail: the prompt after the prefix
        return SanaWMText(hidden[:, keep], mask[:, keep])

    def _encode_negative(self, prompt: str) -> SanaWMText:
        hidden, mask = self._hidden(prompt, self.max_tokens)
        return SanaWMText(hidden, mask)

    @torch.inference_mode()
    def _hidden(self, text: str, length: int) -> tuple[Tensor, Tensor]:
        batch = self.tokenizer([text], max_length=length, padding="max_length", padding_side="right",
                               truncation=True, return_tensors="pt")
        with self._lock, self._on_device():
            ids, mask = batch.input_ids.to(self.device), batch.attention_mask.to(self.device)
            out = self.model(input_ids=ids, attention_mask=mask, output_hidden_states=True, return_dict=True)
        return out.hidden_states[-1], mask

    def _on_device(self) -> contextlib.AbstractContextManager[None]:
        return uploaded(self._offloaded)
