"""Causal time handling of the Wan VAEs: the per-call stream cache and the conv that continues a stream.

Each causal conv needs the frames before a chunk to produce the chunk's first outputs as if the whole video had been
convolved at once. The cache keeps those frames per layer; `CausalCache.stream` writes them and the chunk's conv input
into one buffer (the norm and activation before the conv write straight into it), so no concatenation copies the
chunk, and the time padding the stream has not filled yet (zeros, near its start) is skipped rather than multiplied:
a conv producing one frame drops the kernel taps that would land on zeros.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from vidloom.layers.onednn_conv import Conv3d, convolve

# A kernel-3 causal conv needs the two frames before a chunk to produce the chunk's
# first outputs exactly as if the whole video had been convolved at once.
HISTORY_FRAMES = 2

# into(x, out): writes the conv input computed from x (a norm and activation) into out, a frame slice of a buffer.
WriteInput = Callable[[Tensor, Tensor], object]


class CausalConv3d(Conv3d):
    """3D conv whose output frame t depends only on input frames <= t.

    Height and width are zero-padded inside the conv kernel (no padded copy of the input); only
    the time padding, which comes from the previous chunk's frames, is put in front.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int, int, int],
        padding: int | tuple[int, int, int] = 0,
    ) -> None:
        pad_t, pad_h, pad_w = (padding,) * 3 if isinstance(padding, int) else padding
        super().__init__(in_channels, out_channels, kernel_size, padding=(0, pad_h, pad_w))
        # All the time padding goes before the first frame (twice the symmetric amount)
        # so the receptive field never reaches forward in time.
        self.time_pad = 2 * pad_t

    def forward(self, x: Tensor, past: Tensor | None = None) -> Tensor:
        """Convolve `x`, taking the frames before it from `past` instead of zeros."""
        missing = self.time_pad
        if past is not None and missing > 0:
            x = torch.cat([past, x], dim=2)
            missing -= past.shape[2]
        if missing > 0:
            x = F.pad(x, (0, 0, 0, 0, missing, 0))
        return super().forward(x)

    def forward_short(self, x: Tensor, dropped: int) -> Tensor:
        """Convolve `x` whose first `dropped` frames of time padding are zeros left out: the kernel's first `dropped`
        time taps, which would multiply them, are left out too (exact: they only add zeros)."""
        if dropped == 0:
            return super().forward(x)
        return convolve(x, self.weight[:, :, dropped:], self.bias, self.padding, self.stride, self.dilation)


class CausalCache:
    """Stream state of one encode or decode call: the input tail each causal layer saw last.

    The network is run chunk by chunk along time. Every chunk walks the layers in the
    same order, so the n-th slot claimed within a chunk always belongs to the same
    layer; that lets the state live here, created per call, instead of on the modules
    (which may then be shared by concurrent calls).
    """

    def __init__(self) -> None:
        self._tails: list[Tensor | None] = []
        self._cursor = 0
        self.chunks = 0  # chunks begun so far; 1 while the first is running
        self.last = False  # the running chunk is the call's last: no layer stores a tail for a next one

    def begin_chunk(self, last: bool = False) -> None:
        """Rewind to the first layer before feeding the next chunk through the network; `last`: nothing follows
        it (a one-frame decode's only chunk), so the layers skip copying their input tails."""
        self._cursor = 0
        self.chunks += 1
        self.last = last

    def claim(self) -> int:
        """Slot of the next stateful layer in call order; None-filled on the first chunk."""
        slot = self._cursor
        self._cursor += 1
        if slot == len(self._tails):
            self._tails.append(None)
        return slot

    def get(self, slot: int) -> Tensor | None:
        """What the layer in `slot` stored on the previous chunk (None on the first)."""
        return self._tails[slot]

    def put(self, slot: int, tail: Tensor) -> None:
        """Store the state the layer in `slot` needs for the next chunk."""
        self._tails[slot] = tail

    def stream(self, conv: CausalConv3d, x: Tensor, into: WriteInput | None = None) -> Tensor:
        """Apply `conv` to the next chunk, continuing from the frames it saw before. The conv's input is `x`, or what
        `into(x, out)` writes (a norm and activation of `x`), written once, after the stream's past frames."""
        slot = self.claim()
        past = self.get(slot)
        frames = x.shape[2]
        held = 0 if past is None else min(past.shape[2], conv.time_pad)
        missing = conv.time_pad - held
        # One output frame: drop the taps on the missing frames. More: each output frame lacks other taps, so the
        # missing frames are written as zeros.
        zeros = 0 if frames == 1 else missing
        lead = zeros + held
        if lead == 0 and into is None:
            buffer = x
        else:
            buffer = _empty_frames(x, lead + frames)
            buffer[:, :, :zeros].zero_()
            if held:
                buffer[:, :, zeros:lead].copy_(past[:, :, past.shape[2] - held:])
            if into is None:
                buffer[:, :, lead:].copy_(x)
            else:
                into(x, buffer[:, :, lead:])
        # Copy so the cache does not pin the whole chunk's activations in memory.
        if not self.last:
            self.put(slot, buffer[:, :, max(zeros, buffer.shape[2] - HISTORY_FRAMES):].clone())
        return conv.forward_short(buffer, missing - zeros)


def _empty_frames(like: Tensor, frames: int) -> Tensor:
    """An uninitialised [B, C, frames, H, W] tensor in the memory layout of `like`."""
    layout = (torch.channels_last_3d if like.is_contiguous(memory_format=torch.channels_last_3d)
              and not like.is_contiguous() else torch.contiguous_format)
    b, c, _, h, w = like.shape
    return torch.empty((b, c, frames, h, w), dtype=like.dtype, device=like.device, memory_format=layout)
