"""Qwen-Image's prompt encoder: Qwen2.5-VL (through transformers) read at its last hidden state, the template's
system prefix dropped."""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import torch

from vidloom.text_encoders.offloaded_weights import hold, uploaded
from vidloom.text_encoders.pretrained import load_pretrained, load_tokenizer
from vidloom.text_encoders.prompt_cache import EmbeddingCache

if TYPE_CHECKING:  # transformers' model classes load with the encoder: `vidloom models` reads this module's constants
    from PIL import Image
    from transformers import PreTrainedTokenizerBase, Qwen2_5_VLForConditionalGeneration

# QwenImagePipeline's prompt template and the number of its leading tokens dropped from the embedding (the
# system turn and "<|im_start|>user\n"); prompts may hold up to 1024 tokens after them.
PROMPT_TEMPLATE = (
    "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, spatial "
    "relationships of the objects and background:<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
)
DROPPED_TOKENS = 34
MAX_PROMPT_TOKENS = 1024
# QwenImageEditPlusPipeline's: the reference images sit in the user turn before the prompt, each as "Picture N: "
# and its vision tokens (QwenImageEditPipeline's: the one image's vision tokens, unnumbered); 64 leading tokens
# dropped.
EDIT_PLUS_TEMPLATE = (
    "<|im_start|>system\nDescribe the key features of the input image (color, shape, size, texture, objects, "
    "background), then explain how the user's text instruction should alter or modify the image. Generate a new "
    "image that meets the user's requirements while maintaining consistency with the original input where "
    "appropriate.<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
)
VISION = "<|vision_start|><|image_pad|><|vision_end|>"
EDIT_TEMPLATE = EDIT_PLUS_TEMPLATE.replace("{}", VISION + "{}")
EDIT_DROPPED_TOKENS = 64
IMAGE_PAD = "<|image_pad|>"


class QwenImageTextEncoder:
    """Prompts -> one [1, L, hidden] embedding each (L: the prompt's own length; no padding), on `device`.

    Each prompt is encoded alone, as the pipeline encodes its prompt and its negative prompt: unpadded, so the
    transformer needs no attention mask. Shared by every request; `offload` and `cache_size` as for Wan's encoder.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, model: Qwen2_5_VLForConditionalGeneration,
                 device: torch.device, *, offload: bool = False, cache_size: int = 0,
                 image_processor: Any = None) -> None:
        self.tokenizer = tokenizer
        self.image_processor = image_processor  # Qwen2-VL's (PIL, no torchvision); None: no image prompts
        self.device = device
        self.model, self._offloaded = hold(model, device, offload)
        self.cache = EmbeddingCache(cache_size)
        self._encoder_lock = threading.Lock()

    @property
    def width(self) -> int:
        return int(self.model.config.text_config.hidden_size)

    @classmethod
    def load(cls, tokenizer_dir: Path, encoder_dir: Path, device: torch.device, dtype: torch.dtype,
             processor_dir: Path | None = None, **options: Any) -> QwenImageTextEncoder:
        tokenizer = load_tokenizer(tokenizer_dir)
        if processor_dir is not None:
            from transformers import Qwen2VLImageProcessorPil

            options["image_processor"] = load_pretrained(Qwen2VLImageProcessorPil, processor_dir,
                                                         "Qwen2-VL image processor", errors=(OSError, ValueError, TypeError))
        from transformers import Qwen2_5_VLForConditionalGeneration

        model = load_pretrained(Qwen2_5_VLForConditionalGeneration, encoder_dir, "Qwen2.5-VL text encoder",
                                dtype=dtype)
        return cls(tokenizer, model.eval(), device, **options)

    def encode(self, prompt: str) -> torch.Tensor:
        """[1, L, hidden] on `device`; a cached prompt is not re-encoded."""
        return self.cache.embed([prompt], self._run_encoder)[0][None].to(self.device)

    def encode_with_image(self, prompt: str, image: Image.Image) -> torch.Tensor:
        """[1, L, hidden]: `prompt` with `image` in QwenImageEditPipeline's template, read by the VL model."""
        return self.encode_with_images(EDIT_TEMPLATE, prompt, [image])

    def encode_with_pictures(self, prompt: str, images: Sequence[Image.Image]) -> torch.Tensor:
        """[1, L, hidden]: `prompt` after "Picture 1: <image> Picture 2: <image> ..." (QwenImageEditPlusPipeline)."""
        pictures = "".join(f"Picture {i}: {VISION}" for i in range(1, len(images) + 1))
        return self.encode_with_images(EDIT_PLUS_TEMPLATE.replace("{}", pictures + "{}"), prompt, images)

    @torch.inference_mode()
    def encode_with_images(self, template: str, prompt: str, images: Sequence[Image.Image]) -> torch.Tensor:
        """[1, L, hidden]: `prompt` in `template`, whose i-th IMAGE_PAD is `images[i]`, read by the VL model (not
        cached); the template's EDIT_DROPPED_TOKENS leading tokens dropped.

        Each image's pad is expanded as Qwen2VLProcessor expands it (one per merged patch), which transformers
        cannot build here: its video processor needs torchvision."""
        vision = self.image_processor(images=list(images), return_tensors="pt")
        grid = vision["image_grid_thw"]
        merge = self.image_processor.merge_size ** 2
        parts = template.split(IMAGE_PAD)
        assert len(parts) == len(images) + 1, "one IMAGE_PAD per image"
        template = parts[0] + "".join(IMAGE_PAD * (int(g.prod()) // merge) + part for g, part in zip(grid, parts[1:]))
        tokens = self.tokenizer([template.format(prompt)], return_tensors="pt")
        with self._encoder_lock, uploaded(self._offloaded):
            device = self.model.device
            out = self.model(input_ids=tokens["input_ids"].to(device),
                             attention_mask=tokens["attention_mask"].to(device),
                             pixel_values=vision["pixel_values"].to(device, self.model.dtype),
                             image_grid_thw=grid.to(device), output_hidden_states=True)
        return out.hidden_states[-1][:, EDIT_DROPPED_TOKENS:].to(self.device)

    @torch.inference_mode()
    def _run_encoder(self, prompts: list[str]) -> list[torch.Tensor]:
        out = []
        with self._encoder_lock, contextlib.ExitStack() as stack:
            stack.enter_context(uploaded(self._offloaded))
            for prompt in prompts:
                tokens = self.tokenizer([PROMPT_TEMPLATE.format(prompt)], max_length=MAX_PROMPT_TOKENS + DROPPED_TOKENS,
                                        truncation=True, return_tensors="pt")
                ids = tokens["input_ids"].to(self.model.device)
                mask = tokens["attention_mask"].to(self.model.device)
                hidden = self.model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states[-1]
                out.append(hidden[0, DROPPED_TOKENS:])
        return out
