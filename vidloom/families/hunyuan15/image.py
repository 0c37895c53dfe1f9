"""HunyuanVideo-1.5's image-to-video inputs: the first frame cropped to its aspect bucket, its pixels for the VAE and
its SigLIP tokens (transformers' SiglipVisionModel read through the PIL image processor: no torchvision)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch import Tensor

from vidloom.text_encoders.pretrained import load_pretrained


def crop_to(image: Image.Image, height: int, width: int) -> Image.Image:
    """`image` resized (Lanczos) to cover height x width with its aspect kept, then centre-cropped to it (the
    pipeline's resize_mode="crop")."""
    image = image.convert("RGB")
    if width / height > image.width / image.height:  # wider target: fit the width, crop rows
        size = (width, image.height * width // image.width)
    else:
        size = (image.width * height // image.height, height)
    resized = image.resize(size, resample=Image.Resampling.LANCZOS)
    out = Image.new("RGB", (width, height))
    out.paste(resized, box=(width // 2 - size[0] // 2, height // 2 - size[1] // 2))
    return out


def pixels(image: Image.Image) -> Tensor:
    """[1, 3, H, W] float32 in [-1, 1]."""
    array = np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0
    return torch.from_numpy(array).permute(2, 0, 1)[None] * 2.0 - 1.0


class Hunyuan15ImageEncoder:
    """Images -> SigLIP's last hidden state [1, tokens, hidden] on `device`."""

    def __init__(self, model: Any, processor: Any, device: torch.device) -> None:
        self.model, self.processor, self.device = model.to(device), processor, device
        self._lock = threading.Lock()

    @property
    def width(self) -> int:
        return int(self.model.config.hidden_size)

    @classmethod
    def load(cls, folder: Path, device: torch.device, dtype: torch.dtype) -> Hunyuan15ImageEncoder:
        """From a pipeline folder's image_encoder and feature_extractor."""
        from transformers import SiglipImageProcessorPil, SiglipVisionModel

        model = load_pretrained(SiglipVisionModel, folder / "image_encoder", "SigLIP image encoder", dtype=dtype)
        processor = load_pretrained(SiglipImageProcessorPil, folder / "feature_extractor", "SigLIP image processor",
                                    errors=(OSError, ValueError, TypeError))
        return cls(model.eval(), processor, device)

    @torch.inference_mode()
    def encode(self, image: Image.Image) -> Tensor:
        inputs = self.processor(images=image, do_resize=True, return_tensors="pt", do_convert_rgb=True)
        with self._lock:
            values = inputs["pixel_values"].to(self.device, next(self.model.parameters()).dtype)
            return self.model(pixel_values=values).last_hidden_state
