"""A text encoder's weights kept in CPU memory and uploaded to the device only while it encodes (offload_text_encoder)."""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch


class OffloadedWeights:
    """A module whose weights live in CPU memory (pinned when the target is CUDA), uploaded per use.

    `on_device()` points every parameter and buffer at a fresh device copy, uploaded
    non-blocking from pinned memory (the encode kernels queue behind the copies on the same
    stream), and afterwards points them back at the CPU tensors: the device copy is dropped,
    never copied back, since the weights did not change.
    """

    def __init__(self, module: torch.nn.Module, device: torch.device) -> None:
        self.device = device
        pin = device.type == "cuda" and torch.cuda.is_available()
        # remove_duplicate (the default) lists a tied weight (UMT5's shared embedding) once.
        self._tensors = [t for _, t in (*module.named_parameters(), *module.named_buffers())]
        self._host = [t.data.pin_memory() if pin else t.data for t in self._tensors]
        for tensor, host in zip(self._tensors, self._host):
            tensor.data = host

    @contextlib.contextmanager
    def on_device(self) -> Iterator[None]:
        for tensor, host in zip(self._tensors, self._host):
            tensor.data = host.to(self.device, non_blocking=True, copy=True)
        try:
            yield
        finally:
            for tensor, host in zip(self._tensors, self._host):
                tensor.data = host


def hold(model: torch.nn.Module, device: torch.device, offload: bool) -> tuple[torch.nn.Module, OffloadedWeights | None]:
    """An encoder's `model` in eval mode where it is held: on `device`, or (`offload` on an accelerator) in CPU
    memory with the OffloadedWeights that upload it per use."""
    if offload and device.type != "cpu":
        model = model.eval().to("cpu")
        return model, OffloadedWeights(model, device)
    return model.eval().to(device), None


def uploaded(offloaded: OffloadedWeights | None) -> contextlib.AbstractContextManager[None]:
    """The weights on the device for a `with` block: uploaded when `offloaded`, else already there."""
    return offloaded.on_device() if offloaded is not None else contextlib.nullcontext()
