"""Audio while the talker decodes: token2wav and the vocoder on chunks of codes as they arrive.

Qwen2.5-Omni's DiT attends within neighbouring blocks of `block_size` mel frames (one block back on
its look-back layers, one ahead on its look-ahead layers), which is what lets the original model
stream: each chunk of codes is decoded on a window holding some codes before it (look-back) and
after it (look-ahead), with the slice of the utterance's initial noise for those frames, and only
the chunk's own frames are kept. The window starts on a block boundary, so its block partition is
the whole utterance's and every attention mask inside it is the whole utterance's.

The vocoder runs on the chunk's mel only, plus its receptive field (families.qwen_omni.vocoder.
receptive_field): behind, the mel already spoken (kept from earlier chunks); ahead, the window's
look-ahead frames. Chunks grow (CHUNK_GROWTH per chunk, up to MAX_CHUNK_CODES): the first is small
for an early first audio, later ones larger so the windows' overlap costs less per code.

Not exact: the ODE runs its velocity network `4 * (ode_steps - 1)` times, so a frame's final value
depends on codes further away than one window (the receptive field grows each call). With a window
covering the whole utterance it is the whole-utterance decode, bit for bit in float32 up to
summation order; tests/parity/test_qwen_omni_stream.py states the tolerance of the default context.
The utterance's noise is drawn up front for the talker's code budget (it cannot know the length
yet), so a streamed request's audio is not the non-streamed one's for the same seed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from vidloom.families.qwen_omni.dit import MelSampler
from vidloom.families.qwen_omni.speakers import Voice
from vidloom.families.qwen_omni.vocoder import receptive_field

STREAM = "token2wav_stream"
# The Qwen2.5-Omni report's sliding-window DiT: a receptive field of 4 blocks, 2 back and 1 ahead.
LOOK_BACK_BLOCKS = 2  # DiT blocks of already spoken codes each chunk's window holds
LOOK_AHEAD_BLOCKS = 1  # DiT blocks of codes after the chunk a window waits for (the latency it adds)
CHUNK_GROWTH = 2  # each chunk this many times the previous one's codes...
MAX_CHUNK_CODES = 200  # ...up to this many (4 s; a larger first chunk stays as it is)


@dataclass(frozen=True)
class AudioPiece:
    """A decoded chunk: samples of codes [start_code, stop_code), and the work it took."""

    index: int
    start_code: int
    stop_code: int
    samples: np.ndarray  # float32 [samples]
    mel: torch.Tensor  # [1, mel_dim, frames] of these codes (the vocoder's left context for the next chunk)
    dit_frames: int = 0  # mel frames the DiT's window integrated
    vocoder_frames: int = 0  # mel frames the vocoder read


@dataclass
class AudioStream:
    """One request's streamed decode: its noise for every frame it may speak, and how far it has spoken."""

    dit: Any
    vocoder: Any
    voice: Voice
    noise: torch.Tensor  # [1, max_codes * repeats, mel_dim]
    chunk_codes: int  # the first chunk's codes
    ode_steps: int
    back_codes: int
    ahead_codes: int
    reach_frames: int  # the vocoder's receptive field, mel frames each side
    emitted: int = 0  # codes whose samples have left
    pieces: list[np.ndarray] = field(default_factory=list)
    spoken_mel: torch.Tensor | None = None  # the last `reach_frames` mel frames already spoken
    dit_frames: int = 0
    vocoder_frames: int = 0

    def chunk_size(self, index: int) -> int:
        """Codes of chunk `index` (before the end of the utterance cuts it)."""
        size = self.chunk_codes
        for _ in range(index):
            size = max(size, min(MAX_CHUNK_CODES, size * CHUNK_GROWTH))
        return size

    def chunk_count(self, codes: int) -> int:
        """How many chunks `codes` codes make (for progress totals)."""
        count, spoken = 0, 0
        while spoken < codes:
            spoken += self.chunk_size(count)
            count += 1
        return count

    def ready(self, available: int, finished: bool) -> bool:
        """Whether the next chunk can be decoded now (its look-ahead has arrived, or no more codes will)."""
        if self.emitted >= available:
            return False
        return finished or available >= self.emitted + self.chunk_size(len(self.pieces)) + self.ahead_codes

    def plan_inputs(self, codes: list[int], finished: bool) -> dict[str, Any]:
        start = self.emitted
        size = self.chunk_size(len(self.pieces))
        stop = min(len(codes), start + size)
        if finished and len(codes) - stop <= min(size, self.ahead_codes):
            stop = len(codes)  # a tail within the look-ahead is in this window anyway: no second window for it
        return {"stream": self, "codes": codes[:min(len(codes), stop + self.ahead_codes)], "start": start,
                "stop": stop, "last": finished and stop == len(codes)}

    def add(self, piece: AudioPiece) -> None:
        self.pieces.append(piece.samples)
        self.emitted = piece.stop_code
        spoken = piece.mel if self.spoken_mel is None else torch.cat([self.spoken_mel, piece.mel], dim=2)
        self.spoken_mel = spoken[:, :, max(0, spoken.shape[2] - self.reach_frames):]
        self.dit_frames += piece.dit_frames
        self.vocoder_frames += piece.vocoder_frames

    def audio(self) -> np.ndarray:
        return np.concatenate(self.pieces) if self.pieces else np.zeros(0, dtype=np.float32)


def open_stream(dit: Any, vocoder: Any, voice: Voice, max_codes: int, chunk_codes: int, ode_steps: int,
                seed: int | None) -> AudioStream:
    """A stream whose windows reach LOOK_BACK/LOOK_AHEAD DiT blocks around each chunk."""
    c = dit.config
    block_codes = max(1, c.block_size // c.repeats)
    generator = torch.Generator().manual_seed(seed) if seed is not None else None
    noise = torch.randn((1, max_codes * c.repeats, c.mel_dim), generator=generator, dtype=torch.float32)
    return AudioStream(dit, vocoder, voice, noise, chunk_codes, ode_steps, LOOK_BACK_BLOCKS * block_codes,
                       LOOK_AHEAD_BLOCKS * block_codes, receptive_field(vocoder.config))


def largest_window(dit: Any, vocoder: Any, chunk_codes: int, max_codes: int) -> tuple[int, int]:
    """(mel frames of the largest DiT window, of the largest vocoder input) a stream of `max_codes` codes can run:
    its largest chunk, a tail absorbed into it, the look-back from a block boundary and the look-ahead; the
    vocoder's receptive field on both sides (for memory estimates)."""
    block_codes = max(1, dit.block_size // dit.repeats)
    back, ahead = LOOK_BACK_BLOCKS * block_codes, LOOK_AHEAD_BLOCKS * block_codes
    chunk = min(max_codes, max(chunk_codes, MAX_CHUNK_CODES)) + ahead  # + a tail within the look-ahead
    window = min(max_codes, chunk + back + block_codes - 1 + ahead)
    return window * dit.repeats, min(max_codes * dit.repeats, (chunk + ahead) * dit.repeats + 2 * receptive_field(vocoder))


def window_mel(dit: Any, voice: Voice, codes: torch.Tensor, noise: torch.Tensor, ode_steps: int) -> torch.Tensor:
    """codes [N] with their initial noise [1, N * repeats, mel] -> mel [1, mel_dim, N * repeats]."""
    param = next(dit.parameters())
    sampler = MelSampler(dit, num_steps=ode_steps)
    state = sampler.start(codes.to(param.device), voice.cond.to(param.device, param.dtype),
                          voice.ref_mel.to(param.device, param.dtype), None, noise=noise)
    while state.step < state.total:
        state = sampler.step(state)
    return MelSampler.mel(state)


def decode_window(dit: Any, vocoder: Any, voice: Voice, codes: torch.Tensor, noise: torch.Tensor,
                  ode_steps: int) -> tuple[torch.Tensor, np.ndarray]:
    """The whole of a window: (mel [1, mel_dim, N * repeats], float32 samples [N * repeats * hop (+ the
    vocoder's tail)])."""
    mel = window_mel(dit, voice, codes, noise, ode_steps)
    return mel, vocoder(mel)[0].float().cpu().numpy()


def decode_chunk(stream: AudioStream, codes: list[int], start: int, stop: int, last: bool) -> AudioPiece:
    """Samples of codes [start, stop): the DiT on a block-aligned window with look-back and look-ahead, the
    vocoder on the chunk's frames within its receptive field of spoken and look-ahead mel; the `last` chunk
    keeps the vocoder's tail too (its transposed convolutions may add a few samples)."""
    c = stream.dit.config
    block_codes = max(1, c.block_size // c.repeats)
    first = max(0, start - stream.back_codes) // block_codes * block_codes
    end = len(codes)
    window = torch.tensor(codes[first:end], dtype=torch.long)
    noise = stream.noise[:, first * c.repeats:end * c.repeats]
    own_from, own_to = (start - first) * c.repeats, (stop - first) * c.repeats
    with torch.inference_mode():
        mel = window_mel(stream.dit, stream.voice, window, noise, stream.ode_steps)
        own = mel[:, :, own_from:own_to]
        behind = own[:, :, :0] if stream.spoken_mel is None else stream.spoken_mel.to(own.device, own.dtype)
        ahead = mel[:, :, own_to:own_to + stream.reach_frames]
        wave = stream.vocoder(torch.cat([behind, own, ahead], dim=2))[0].float().cpu().numpy()
    hop = stream.vocoder.config.hop
    keep = wave[behind.shape[2] * hop:None if last else (behind.shape[2] + own.shape[2]) * hop]
    return AudioPiece(len(stream.pieces), start, stop, keep.copy(), own.clone(), dit_frames=mel.shape[2],
                      vocoder_frames=behind.shape[2] + own.shape[2] + ahead.shape[2])
