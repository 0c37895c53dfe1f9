"""HunyuanVideo-1.5's prompt encoders: Qwen2.5-VL's text model (through transformers) read at its third-last
hidden state with the chat template's system prefix cropped, and ByT5 (T5EncoderModel) over the prompt's quoted
text, which the glyph tokens render (none without quotes).

Each prompt is encoded alone and unpadded (the pipeline pads to 1108 and 256 tokens and masks the padding, which
leaves the valid tokens as they are: causal Qwen, masked T5 keys), so the embeddings hold valid tokens only. Under
--cuda-graphs the denoise loop pads them to prompt-length buckets (`bucketed`), the valid counts a tensor, so one
captured step serves every prompt length of a bucket.
"""

from __future__ import annotations

import contextlib
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor
import torch.nn.functional as F

from vidloom.core.errors import CheckpointError
from vidloom.runtime.prompt_buckets import bucket_length
from vidloom.text_encoders.offloaded_weights import hold, uploaded
from vidloom.text_encoders.pretrained import load_pretrained, load_tokenizer
from vidloom.text_encoders.prompt_cache import EmbeddingCache

if TYPE_CHECKING:  # transformers' model classes load with the encoder
    from transformers import PreTrainedTokenizerBase

# HunyuanVideo15Pipeline's system turn (its line continuations leave runs of eight spaces in the text).
SYSTEM_MESSAGE = "You are a helpful assistant. Describe the video by detailing the following aspects:" + "".join(
    f"         {line}" for line in (
        "1. The main content and theme of the video.",
        "2. The color, shape, size, texture, quantity, text, and spatial relationships of the objects.",
        "3. Actions, events, behaviors temporal relationships, physical movement changes of the objects.",
        "4. background environment, light, style and atmosphere.",
        "5. camera angles, movements, and transitions used in the video."))
MAX_PROMPT_TOKENS = 1000  # the pipeline's tokenizer_max_length, after the cropped prefix
MAX_GLYPH_TOKENS = 256  # tokenizer_2_max_length (ByT5: one token per byte, plus </s>)
HIDDEN_LAYER = -3  # hidden_states[-(num_hidden_layers_to_skip + 1)], skipping 2
# Quoted spans, straight or curly quotes: each becomes `Text "..."`. in the glyph prompt.
QUOTED = re.compile(r"\"(.*?)\"|\u201c(.*?)\u201d")


def glyph_text(prompt: str) -> str | None:
    """The ByT5 prompt of `prompt`'s quoted spans (repeats dropped when there are several), None without quotes."""
    spans = [a or b for a, b in QUOTED.findall(prompt)]
    if len(spans) > 1:
        spans = list(dict.fromkeys(spans))
    return "".join(f'Text "{span}". ' for span in spans) if spans else None


@dataclass(frozen=True)
class PromptEmbeds:
    """One prompt's condition tokens (valid ones only, or bucket-padded: `valid`), on the encoder's device."""

    text: Tensor  # [L, text_dim]
    glyph: Tensor  # [Lg, glyph_dim]; Lg = 0 without quoted text
    # None: every row is valid (the eager path). Bucket-padded (`bucketed`, under --cuda-graphs): [2] int64 on the
    # device, the valid (text, glyph) rows, a prefix of each; a tensor, so a captured step reads it from a static
    # buffer refilled per replay rather than holding the counts in its signature.
    valid: Tensor | None = None


def bucketed(embeds: PromptEmbeds) -> PromptEmbeds:
    """`embeds` with its text padded with zero rows to its prompt-length bucket (runtime.prompt_buckets) and its glyph
    tokens likewise (none stays none: a prompt without quoted text keeps no glyph row), the valid counts a tensor."""
    text, glyph = embeds.text, embeds.glyph
    rows = (text.shape[0], glyph.shape[0])
    padded = (bucket_length(rows[0]), bucket_length(rows[1]) if rows[1] else 0)
    return PromptEmbeds(F.pad(text, (0, 0, 0, padded[0] - rows[0])), F.pad(glyph, (0, 0, 0, padded[1] - rows[1])),
                        torch.tensor(rows, dtype=torch.int64, device=text.device))


def stack_prompts(prompts: list[PromptEmbeds]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Prompts -> (text [B, L, D], text_mask [B, L], glyph [B, Lg, Dg], glyph_mask [B, Lg]), right-padded with
    zeros to the longest; a batch without any glyph keeps one masked glyph row (the transformer drops it). A
    bucket-padded prompt's mask marks its `valid` rows, compared on the device (no host read)."""
    def pad(rows: list[Tensor], valid: list[Tensor | int], minimum: int) -> tuple[Tensor, Tensor]:
        length = max(minimum, *(r.shape[0] for r in rows))
        out = torch.stack([F.pad(r, (0, 0, 0, length - r.shape[0])) for r in rows])
        mask = torch.stack([torch.arange(length, device=out.device) < n for n in valid])
        return out, mask

    def counts(part: int) -> list[Tensor | int]:
        return [p.valid[part] if p.valid is not None else (p.text, p.glyph)[part].shape[0] for p in prompts]

    text, text_mask = pad([p.text for p in prompts], counts(0), 1)
    glyph, glyph_mask = pad([p.glyph for p in prompts], counts(1), 1)
    return text, text_mask, glyph, glyph_mask


class Hunyuan15TextEncoder:
    """Prompts -> PromptEmbeds. Shared by every request; `offload` and `cache_size` as for Wan's encoder (both
    models move together)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, model: Any, glyph_tokenizer: PreTrainedTokenizerBase,
                 glyph_model: Any, device: torch.device, *, offload: bool = False, cache_size: int = 0) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise CheckpointError("tokenizer has no chat template (HunyuanVideo-1.5 prompts need one)")
        self.tokenizer, self.glyph_tokenizer = tokenizer, glyph_tokenizer
        self.device = device
        self.model, self._offloaded = hold(model, device, offload)
        self.glyph_model, self._glyph_offloaded = hold(glyph_model, device, offload)
        self.cache = EmbeddingCache(cache_size)
        self._encoder_lock = threading.Lock()
        self.crop = self._prefix_tokens()

    @property
    def width(self) -> int:
        return int(self.model.config.hidden_size)

    @property
    def glyph_width(self) -> int:
        return int(self.glyph_model.config.d_model)

    @classmethod
    def load(cls, folder: Path, device: torch.device, dtype: torch.dtype, **options: Any) -> Hunyuan15TextEncoder:
        """From a pipeline folder's tokenizer, text_encoder, tokenizer_2 and text_encoder_2."""
        from transformers import Qwen2_5_VLTextModel, T5EncoderModel

        model = load_pretrained(Qwen2_5_VLTextModel, folder / "text_encoder", "Qwen2.5-VL text encoder", dtype=dtype)
        glyph = load_pretrained(T5EncoderModel, folder / "text_encoder_2", "ByT5 glyph encoder", dtype=dtype)
        return cls(load_tokenizer(folder / "tokenizer"), model.eval(), load_tokenizer(folder / "tokenizer_2"),
                   glyph.eval(), device, **options)

    def _template_ids(self, prompt: str) -> list[int]:
        messages = [{"role": "system", "content": SYSTEM_MESSAGE}, {"role": "user", "content": prompt or " "}]
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)

    def _prefix_tokens(self) -> int:
        """The template's tokens before the user's text (the pipeline crops a fixed 108: the count for Qwen2.5-VL's
        own tokenizer), counted as the common prefix of two renderings."""
        a, b = self._template_ids("a"), self._template_ids("b")
        return next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)

    def encode(self, prompts: list[str]) -> list[PromptEmbeds]:
        """One PromptEmbeds per prompt, on `device`; cached prompts are not re-encoded ("" reads as " ", as the
        pipeline's template writes an empty prompt)."""
        found = self.cache.embed(prompts, self._run_encoders)
        return [PromptEmbeds(e.text.to(self.device), e.glyph.to(self.device)) for e in found]  # type: ignore[attr-defined]

    @torch.inference_mode()
    def _run_encoders(self, prompts: list[str]) -> list[PromptEmbeds]:
        out = []
        with self._encoder_lock, contextlib.ExitStack() as stack:
            stack.enter_context(uploaded(self._offloaded))
            stack.enter_context(uploaded(self._glyph_offloaded))
            for prompt in prompts:
                ids = torch.tensor([self._template_ids(prompt)[:self.crop + MAX_PROMPT_TOKENS]],
                                   device=self.model.device)
                hidden = self.model(input_ids=ids, attention_mask=torch.ones_like(ids),
                                    output_hidden_states=True).hidden_states[HIDDEN_LAYER]
                out.append(PromptEmbeds(hidden[0, self.crop:], self._glyph(prompt)))
        return out

    def _glyph(self, prompt: str) -> Tensor:
        text = glyph_text(prompt)
        model = self.glyph_model
        if text is None:
            return torch.zeros(0, self.glyph_width, device=model.device, dtype=model.dtype)
        tokens = self.glyph_tokenizer(text, max_length=MAX_GLYPH_TOKENS, truncation=True, return_tensors="pt")
        ids = tokens["input_ids"].to(model.device)
        return model(input_ids=ids, attention_mask=torch.ones_like(ids, dtype=torch.float32))[0][0]
