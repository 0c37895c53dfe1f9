"""Stable Audio Open's prompt encoder: T5 (through transformers), then our projection to the DiT's text width."""

from __future__ import annotations

import threading
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerBase, T5EncoderModel

from vidloom.core.errors import CheckpointError
from vidloom.families.stable_audio.projection import StableAudioProjection
from vidloom.text_encoders.pretrained import load_pretrained, load_tokenizer
from vidloom.text_encoders.prompt_cache import EmbeddingCache

# A tokenizer saved without a length says model_max_length = 1e30; the real checkpoint's says 128.
MAX_TEXT_TOKENS = 4096


class StableAudioTextEncoder:
    """Prompts -> [batch, max_length, conditioning_dim] on `device`, padding positions zero.

    Every prompt (the negative one too) is padded to the tokenizer's model_max_length, run through T5 with
    its mask, projected, and multiplied by the mask: what StableAudioPipeline.encode_prompt gives for either
    branch. Shared by every request; `cache_size` keeps that many prompts' embeddings (the prompt cache).
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, model: T5EncoderModel, projection: StableAudioProjection,
                 device: torch.device, cache_size: int = 0) -> None:
        length = int(tokenizer.model_max_length)
        if not 1 <= length <= MAX_TEXT_TOKENS:
            raise CheckpointError(f"tokenizer: model_max_length={length} (prompts are padded to it); expected "
                                  f"1..{MAX_TEXT_TOKENS}")
        width = int(model.config.d_model)
        if width != projection.config.text_dim:
            raise CheckpointError(f"text encoder gives {width}-wide states, projection_model text_encoder_dim is "
                                  f"{projection.config.text_dim}")
        self.tokenizer, self.model, self.projection = tokenizer, model.eval().to(device), projection
        self.device = device
        self.max_length = length
        self.cache = EmbeddingCache(cache_size)
        self._lock = threading.Lock()

    @classmethod
    def load(cls, tokenizer_dir: Path, encoder_dir: Path, projection: StableAudioProjection, device: torch.device,
             dtype: torch.dtype, cache_size: int = 0) -> StableAudioTextEncoder:
        tokenizer = load_tokenizer(tokenizer_dir)
        model = load_pretrained(T5EncoderModel, encoder_dir, "T5 text encoder", dtype=dtype)
        return cls(tokenizer, model, projection, device, cache_size)

    def encode(self, prompts: list[str]) -> torch.Tensor:
        """[len(prompts), max_length, conditioning_dim]; cached prompts are not re-encoded."""
        # One prompt per T5 call, as the pipeline encodes each branch.
        embedded = self.cache.embed(prompts, lambda texts: [self._run(text)[0] for text in texts])
        return torch.stack(embedded).to(self.device)

    @torch.inference_mode()
    def _run(self, prompt: str) -> torch.Tensor:
        tokens = self.tokenizer([prompt], padding="max_length", max_length=self.max_length, truncation=True,
                                return_tensors="pt")
        with self._lock:
            ids = tokens.input_ids.to(self.model.device)
            mask = tokens.attention_mask.to(self.model.device)
            hidden = self.model(ids, attention_mask=mask)[0]
            projected = self.projection.text_projection(hidden.to(self._projection_dtype()))
        return projected * mask.unsqueeze(-1).to(projected.dtype)

    def _projection_dtype(self) -> torch.dtype:
        return next(iter(self.projection.parameters())).dtype
