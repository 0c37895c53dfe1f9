"""Wan2.1 I2V image encoding: the checkpoint's CLIP vision tower and processor, through transformers.

Matches diffusers' WanImageToVideoPipeline.encode_image: the processor resizes and normalises
the original image, and the tokens are the vision tower's second-to-last hidden states.
"""

from __future__ import annotations

import threading
from pathlib import Path

import torch
from PIL import Image
from transformers import CLIPImageProcessor, CLIPVisionModel

from vidloom.text_encoders.pretrained import load_pretrained


class WanImageEncoder:
    """Images -> CLIP tokens [N, 1 + patches, hidden]; shared by every request (weights are read-only)."""

    def __init__(self, processor: CLIPImageProcessor, model: CLIPVisionModel, device: torch.device) -> None:
        self.processor = processor
        self.model = model.eval().to(device)
        self.device = device
        self._lock = threading.Lock()  # the processor is not documented as thread-safe

    @classmethod
    def load(
        cls, processor_dir: Path, encoder_dir: Path, device: torch.device, dtype: torch.dtype
    ) -> "WanImageEncoder":
        processor = load_pretrained(CLIPImageProcessor, processor_dir, "the CLIP image processor",
                                    errors=(OSError, ValueError))
        model = load_pretrained(CLIPVisionModel, encoder_dir, "the CLIP vision encoder", errors=(OSError, ValueError),
                                dtype=dtype)
        return cls(processor, model, device)

    @torch.inference_mode()
    def encode(self, images: list[Image.Image]) -> torch.Tensor:
        """[len(images), tokens, hidden] float tokens on `device` (all images of one request in one batch)."""
        with self._lock:
            pixels = self.processor(images=images, return_tensors="pt").pixel_values
        pixels = pixels.to(self.device, self.model.dtype)
        hidden = self.model(pixel_values=pixels, output_hidden_states=True).hidden_states
        return hidden[-2]
