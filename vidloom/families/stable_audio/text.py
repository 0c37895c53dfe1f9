"""Stable Audio Open's prompt encoder: T5 (through transformers), then our projection to the DiT's text width."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import torch
from safetensors import SafetensorError
from transformers import AutoTokenizer, PreTrainedTokenizerBase, T5EncoderModel

from vidloom.core.errors import CheckpointError
from vidloom.families.stable_audio.projection import StableAudioProjection
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
        try:
            tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"{tokenizer_dir}: cannot load tokenizer ({exc})") from None
        try:
            model = T5EncoderModel.from_pretrained(str(encoder_dir), dtype=dtype)
        except (OSError, ValueError, SafetensorError) as exc:
            raise CheckpointError(f"{encoder_dir}: cannot load T5 text encoder ({exc})") from None
        return cls(tokenizer, model, projection, device, cache_size)

    def encode(self, prompts: list[str]) -> torch.Tensor:
        """[len(prompts), max_length, conditioning_dim]; cached prompts are not re-encoded."""
        keys = [hashlib.sha256(p.encode()).hexdigest() for p in prompts]
        found = {key: emb for key in keys if (emb := self.cache.get(key)) is not None}
        missing = list(dict.fromkeys(k for k in keys if k not in found))
        if missing:
            texts = dict(zip(keys, prompts))
            for key in missing:  # one prompt per T5 call, as the pipeline encodes each branch
                emb = self._run(texts[key])[0]
                self.cache.put(key, emb)
                found[key] = emb
        return torch.stack([found[key] for key in keys]).to(self.device)

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
