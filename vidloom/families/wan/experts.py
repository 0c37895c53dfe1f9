"""Placement of a two-expert model's weights (Wan2.2 A14B): only the expert that runs is on the device.

Each expert keeps one resident copy in host memory (pinned for CUDA); `activate` points the
running expert's parameters at a fresh device copy and the idle one's back at its host copy,
so device memory holds one expert's weights at a time. Experts switch once per request in the
usual schedule (high-noise steps, then low-noise), so the upload is paid about once per request.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Mapping

import torch
from torch import Tensor, nn


class ExpertPlacement:
    """Keeps at most one of `experts` on `device`; the others live in host memory."""

    def __init__(self, experts: Mapping[str, nn.Module], device: torch.device) -> None:
        self.device = device
        pin = device.type == "cuda" and torch.cuda.is_available()
        self._tensors: dict[str, list[Tensor]] = {}
        self._host: dict[str, list[Tensor]] = {}
        for name, module in experts.items():
            tensors = [t for _, t in (*module.named_parameters(), *module.named_buffers())]
            host = [t.data.to("cpu").pin_memory() if pin else t.data.to("cpu") for t in tensors]
            for tensor, copy in zip(tensors, host):
                tensor.data = copy
            self._tensors[name], self._host[name] = tensors, host
        self.resident: str | None = None
        self.uploads = 0  # how many times an expert was moved to the device (observability, tests)
        self._lock = threading.Lock()

    def activate(self, name: str) -> None:
        """Make `name` the expert on the device (a no-op when it already is)."""
        with self._lock:
            if self.resident == name:
                return
            if self.resident is not None:
                for tensor, host in zip(self._tensors[self.resident], self._host[self.resident]):
                    tensor.data = host  # the device copy is dropped, never copied back: weights are read-only
            for tensor, host in zip(self._tensors[name], self._host[name]):
                tensor.data = host.to(self.device, non_blocking=True, copy=True)
            self.resident = name
            self.uploads += 1

    def is_resident(self, name: str) -> bool:
        return all(t.data.data_ptr() != h.data_ptr() for t, h in zip(self._tensors[name], self._host[name]))


@dataclass(frozen=True)
class PlacedNetwork:
    """An expert that makes itself resident before it runs; staged like the DiT for step caches."""

    placement: ExpertPlacement
    name: str
    network: Any

    @property
    def config(self) -> Any:
        return self.network.config

    def batch_key(self) -> tuple[Any, ...]:
        """Every request's view of one expert is the same network (runtime.batching): they stack."""
        return ("placed", id(self.placement), self.name, id(self.network))

    @staticmethod
    def stack(views: list["PlacedNetwork"]) -> "PlacedNetwork":
        return views[0]

    @property
    def num_blocks(self) -> int:
        return self.network.num_blocks

    def __call__(self, latents: Tensor, timestep: Tensor, text_embeds: Tensor, *image: Tensor) -> Tensor:
        x, cond = self.embed(latents, timestep, text_embeds, *image)
        return self.head(self.run_blocks(x, cond), cond)

    def prepare_prompt(self, text_embeds: Tensor) -> Any:
        """The expert's own prompt keys/values (core.denoiser.PreparesPrompt), prepared with its weights resident."""
        self.placement.activate(self.name)
        return self.network.prepare_prompt(text_embeds)

    def prepare_image(self, image_embeds: Tensor) -> Any:
        """The expert's own image keys/values (I2V), prepared with its weights resident."""
        self.placement.activate(self.name)
        return self.network.prepare_image(image_embeds)

    def embed(self, latents: Tensor, timestep: Tensor, text_embeds: Tensor, *image: Tensor) -> tuple[Tensor, Any]:
        self.placement.activate(self.name)
        return self.network.embed(latents, timestep, text_embeds, *image)

    def run_blocks(self, x: Tensor, cond: Any, start: int = 0, end: int | None = None) -> Tensor:
        return self.network.run_blocks(x, cond, start, end)

    def block_input(self, x: Tensor, cond: Any, index: int = 0) -> Tensor:
        return self.network.block_input(x, cond, index)

    def head(self, x: Tensor, cond: Any) -> Tensor:
        return self.network.head(x, cond)
