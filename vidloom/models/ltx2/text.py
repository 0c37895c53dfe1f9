"""LTX-2's prompt path: Gemma3 (through transformers) read at every layer, then our text connectors (LTX-2 and the
SANA-WM refiner)."""

from __future__ import annotations

import contextlib
import hashlib
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import SafetensorError
from torch import Tensor

from vidloom.core.errors import CheckpointError
from vidloom.lora.apply import component_loras, current_loras, loras_signature
from vidloom.models.ltx2.connectors import LTX2TextConnectors
from vidloom.text_encoders.offloaded_weights import hold, uploaded
from vidloom.text_encoders.pretrained import load_tokenizer
from vidloom.text_encoders.prompt_cache import EmbeddingCache

if TYPE_CHECKING:  # transformers' model classes load with the encoder: `vidloom models` reads this module's constants
    from transformers import PreTrainedTokenizerBase

# LTX2Pipeline's max_sequence_length default: prompts are left-padded (Gemma's chat-style side) to this.
LTX2_TEXT_TOKENS = 1024
# The connectors' masked-range normalisation scale (LTX2TextConnectors.forward's scale_factor default).
NORM_SCALE = 8


@dataclass(frozen=True)
class LTX2Text:
    """One batch of encoded prompts as the transformer reads them."""

    video: Tensor  # [B, L, caption width] video-stream text
    audio: Tensor  # [B, L, caption width] audio-stream text
    mask: Tensor  # [B, L] 1 = attend

    def cat(self, other: LTX2Text) -> LTX2Text:
        return self.stack([self, other])

    def batch_key(self) -> tuple[Any, ...]:
        """Prompts stack across requests (runtime.batching) when their padded shapes and dtypes agree."""
        return tuple((tuple(t.shape[1:]), t.dtype, t.device) for t in (self.video, self.audio, self.mask))

    def stack(self, batches: list[LTX2Text]) -> LTX2Text:
        """The batches' rows in order (CFG's pair, cross-request batching)."""
        return LTX2Text(*(torch.cat([getattr(b, name) for b in batches]) for name in ("video", "audio", "mask")))

    def to(self, dtype: torch.dtype) -> LTX2Text:
        return LTX2Text(self.video.to(dtype), self.audio.to(dtype), self.mask)


CONNECTORS = "connectors"
"""The instance component (and LoRA prefix) of the text connectors: the same module as LTX2TextEncoder.connectors."""


@dataclass(frozen=True)
class _Cached:
    """A prompt-cache entry: the embeddings and the connector adapters they were made under (kept alive)."""

    text: LTX2Text
    adapters: tuple[Any, ...]


class LTX2TextEncoder:
    """Prompts -> LTX2Text on `device`. Each prompt is stripped, tokenized with left padding to
    `max_length`, run through Gemma3 with every hidden state kept ([B, L, hidden * (layers + 1)]),
    then through the connectors. Shared by every request (the encoder call is serialised)."""

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, model: Any, connectors: LTX2TextConnectors, device: torch.device,
        *, max_length: int = LTX2_TEXT_TOKENS, offload: bool = False, cache_size: int = 0,
    ) -> None:
        self.tokenizer = tokenizer
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.device = device
        self.max_length = max_length
        self.connectors = connectors.to(device).eval()
        self.model, self._offloaded = hold(model, device, offload)
        self._lock = threading.Lock()
        # Keyed by the whole prompt list (prompt, or negative + prompt): the connectors run over that batch,
        # so a hit returns exactly what encoding it again would (DeployConfig.prompt_cache_size).
        self.cache = EmbeddingCache(cache_size)

    @property
    def hidden_states(self) -> int:
        """Hidden states the encoder returns (layers + the embeddings): the connectors' text_proj_in_factor."""
        config = getattr(self.model.config, "text_config", self.model.config)
        return int(config.num_hidden_layers) + 1

    @property
    def hidden_size(self) -> int:
        return int(getattr(self.model.config, "text_config", self.model.config).hidden_size)

    @classmethod
    def load(cls, tokenizer_dir: Path, encoder_dir: Path, connectors: LTX2TextConnectors, device: torch.device,
             dtype: torch.dtype, **options: Any) -> LTX2TextEncoder:
        tokenizer = load_tokenizer(tokenizer_dir)
        try:
            from transformers import AutoModel, Gemma3ForConditionalGeneration

            model = Gemma3ForConditionalGeneration.from_pretrained(str(encoder_dir), dtype=dtype)
        except (OSError, ValueError, SafetensorError) as exc:
            try:  # a text-only Gemma3 folder
                model = AutoModel.from_pretrained(str(encoder_dir), dtype=dtype)
            except (OSError, ValueError, SafetensorError):
                raise CheckpointError(f"{encoder_dir}: cannot load Gemma3 text encoder ({exc})") from None
        return cls(tokenizer, model, connectors, device, **options)

    def encode(self, prompts: list[str]) -> LTX2Text:
        """Each prompt encoded alone (as the pipeline encodes prompt and negative prompt in two calls);
        a prompt list seen recently (prompt cache) under the same connector adapters is not encoded again."""
        # The request's LoRA adapters on the connectors (vidloom.lora.apply, in force while this runs) change
        # the embeddings, so they are part of the key; the entry keeps them alive, so their identities in the
        # key cannot be reused by another adapter while it is cached.
        adapters = component_loras(current_loras(), CONNECTORS)
        key = hashlib.sha256("\0".join(p.strip() for p in prompts).encode()).hexdigest()
        if adapters:
            key += "|" + loras_signature(adapters)
        cached = self.cache.get(key)
        if cached is not None:
            return cached.text  # type: ignore[union-attr]  # the cache holds _Cached values here
        text = self._encode(prompts)
        self.cache.put(key, _Cached(text, adapters))  # type: ignore[arg-type]
        return text

    @torch.inference_mode()
    def _encode(self, prompts: list[str]) -> LTX2Text:
        stacked, masks = zip(*(self._hidden([p]) for p in prompts))
        hidden, mask = torch.cat(stacked), torch.cat(masks)
        dtype = next(self.connectors.parameters()).dtype
        video, audio, keep = self.connectors(hidden.to(self.device, dtype), mask.to(self.device), "left", NORM_SCALE)
        return LTX2Text(video, audio, keep)

    def _hidden(self, prompts: list[str]) -> tuple[Tensor, Tensor]:
        batch = self.tokenizer([p.strip() for p in prompts], padding="max_length", max_length=self.max_length,
                               truncation=True, add_special_tokens=True, return_tensors="pt")
        with self._lock, self._on_device():
            ids, mask = batch.input_ids.to(self.model.device), batch.attention_mask.to(self.model.device)
            out = self.model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
            hidden = torch.stack(out.hidden_states, dim=-1).flatten(2, 3)
        return hidden, mask

    def _on_device(self) -> contextlib.AbstractContextManager[None]:
        return uploaded(self._offloaded)
