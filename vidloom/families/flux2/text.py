"""Flux2 Klein's prompt encoder: a Qwen3 causal LM read at several hidden layers (through transformers)."""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from vidloom.core.errors import CheckpointError
from vidloom.text_encoders.offloaded_weights import hold, uploaded
from vidloom.text_encoders.pretrained import load_pretrained, load_tokenizer
from vidloom.text_encoders.prompt_cache import EmbeddingCache

if TYPE_CHECKING:  # transformers' model classes load with the encoder: `vidloom models` reads this module's constants
    from transformers import PreTrainedTokenizerBase, Qwen3ForCausalLM

# Flux2KleinPipeline's defaults: prompts are padded to 512 tokens and the embedding stacks the
# hidden states after layers 9, 18 and 27 (so the transformer's text width is 3 x hidden size).
FLUX2_TEXT_TOKENS = 512
FLUX2_TEXT_LAYERS = (9, 18, 27)


class Flux2TextEncoder:
    """Prompts -> [batch, max_length, len(layers) * hidden] embeddings on `device`.

    Each prompt is wrapped in the tokenizer's chat template as one user turn with thinking
    disabled (what the Klein pipeline feeds Qwen3), padded to `max_length`. Shared by every
    request; `offload` and `cache_size` work as for Wan's encoder.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        model: Qwen3ForCausalLM,
        device: torch.device,
        *,
        layers: tuple[int, ...] = FLUX2_TEXT_LAYERS,
        max_length: int = FLUX2_TEXT_TOKENS,
        offload: bool = False,
        cache_size: int = 0,
    ) -> None:
        depth = model.config.num_hidden_layers
        if max(layers) > depth:
            raise CheckpointError(
                f"text encoder has {depth} layers but the Flux2 embedding reads hidden states {layers}; "
                f"it needs at least {max(layers) + 1} layers"
            )
        self.tokenizer = tokenizer
        self.device = device
        self.layers = layers
        self.max_length = max_length
        self.model, self._offloaded = hold(model, device, offload)
        self.cache = EmbeddingCache(cache_size)
        self._encoder_lock = threading.Lock()

    @property
    def width(self) -> int:
        return len(self.layers) * int(self.model.config.hidden_size)

    @classmethod
    def load(
        cls, tokenizer_dir: Path, encoder_dir: Path, device: torch.device, dtype: torch.dtype, **options: Any
    ) -> "Flux2TextEncoder":
        tokenizer = load_tokenizer(tokenizer_dir)
        if not getattr(tokenizer, "chat_template", None):
            raise CheckpointError(f"{tokenizer_dir}: tokenizer has no chat template (Flux2 prompts need one)")
        from transformers import Qwen3ForCausalLM

        model = load_pretrained(Qwen3ForCausalLM, encoder_dir, "Qwen3 text encoder", dtype=dtype)
        return cls(tokenizer, model, device, **options)

    def format(self, prompt: str) -> str:
        """The text the encoder reads for `prompt` (the pipeline's chat formatting)."""
        messages = [{"role": "user", "content": prompt}]
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, enable_thinking=False
        )

    def encode(self, prompts: list[str]) -> torch.Tensor:
        """[len(prompts), max_length, width] on `device`; cached prompts are not re-encoded."""
        return torch.stack(self.cache.embed(prompts, self._run_encoder)).to(self.device)

    @torch.inference_mode()
    def _run_encoder(self, prompts: list[str]) -> torch.Tensor:
        batch = [
            self.tokenizer(self.format(p), return_tensors="pt", padding="max_length", truncation=True,
                           max_length=self.max_length)
            for p in prompts
        ]
        with self._encoder_lock, self._on_device():
            ids = torch.cat([b["input_ids"] for b in batch]).to(self.model.device)
            mask = torch.cat([b["attention_mask"] for b in batch]).to(self.model.device)
            out = self.model(input_ids=ids, attention_mask=mask, output_hidden_states=True, use_cache=False)
            hidden = torch.stack([out.hidden_states[k] for k in self.layers], dim=2)  # [B, L, layers, D]
        return hidden.flatten(2)

    def _on_device(self) -> contextlib.AbstractContextManager[None]:
        return uploaded(self._offloaded)
