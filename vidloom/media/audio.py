"""Audio tracks: WAV files (16-bit PCM, stdlib `wave`) and a sound stream muxed beside the video in MP4 (AAC)
and WebM (Opus) via PyAV. Every file write is atomic (media.atomic.atomic_path).

Duration rule: a written track lasts exactly as long as the video (num_frames / fps, rounded to the nearest
sample): a longer waveform is trimmed, a shorter one padded with silence at the end. In MP4/WebM the codec
then works in whole frames (AAC 1024 samples, Opus 20 ms), so the decoded stream matches the video's
duration within one audio frame. VideoOutput.audio itself keeps the model's waveform untouched.
"""

from __future__ import annotations

import wave
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vidloom.core.errors import InvalidRequest
from vidloom.core.output import checked_audio, checked_sample_rate
from vidloom.media.atomic import atomic_path

# container format -> (codec, bit rate, sample rates the codec takes). Constant bit rate, one thread: the
# same samples give the same bytes.
AUDIO_CODECS: dict[str, tuple[str, int, tuple[int, ...]]] = {
    "mp4": ("aac", 192_000, (7350, 8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000, 64000, 88200,
                             96000)),
    "webm": ("libopus", 128_000, (8000, 12000, 16000, 24000, 48000)),
}
LAYOUTS = {1: "mono", 2: "stereo"}


@dataclass(frozen=True)
class AudioTrack:
    """A float32 waveform [channels, samples] in [-1, 1] (louder is clipped on encode) and its rate."""

    samples: np.ndarray
    sample_rate: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "samples", checked_audio(self.samples))  # VideoOutput's rules
        object.__setattr__(self, "sample_rate", checked_sample_rate(self.sample_rate))

    def fitted(self, seconds: float) -> np.ndarray:
        """The waveform trimmed, or padded with trailing silence, to round(seconds x rate) samples."""
        target = max(1, round(seconds * self.sample_rate))
        have = self.samples.shape[1]
        if have >= target:
            return self.samples[:, :target]
        return np.pad(self.samples, ((0, 0), (0, target - have)))


def track_of(audio: np.ndarray | None, sample_rate: int | None) -> AudioTrack | None:
    """A VideoOutput's audio fields as a track (None when it has no sound)."""
    return None if audio is None or sample_rate is None else AudioTrack(audio, sample_rate)


def to_pcm16(samples: np.ndarray) -> np.ndarray:
    """float [-1, 1] -> int16, clipping and rounding to nearest (full scale 32767, symmetric)."""
    return np.round(np.clip(samples, -1.0, 1.0) * 32767.0).astype(np.int16)


def write_wav(track: AudioTrack, path: Path, seconds: float | None = None) -> Path:
    """16-bit PCM WAV of `track` (fitted to `seconds` when given), written atomically."""
    samples = track.samples if seconds is None else track.fitted(seconds)
    interleaved = to_pcm16(samples).T.copy()  # [samples, channels]: WAV interleaves channels
    with atomic_path(path) as tmp:
        with wave.open(str(tmp), "wb") as out:
            out.setnchannels(samples.shape[0])
            out.setsampwidth(2)
            out.setframerate(track.sample_rate)
            out.writeframes(interleaved.astype("<i2").tobytes())
    return path


def read_wav(path: Path) -> AudioTrack:
    """A 16-bit PCM WAV back to float32 [channels, samples] (x / 32767)."""
    with wave.open(str(path), "rb") as source:
        if source.getsampwidth() != 2:
            raise ValueError(f"{path}: {8 * source.getsampwidth()}-bit WAV; only 16-bit PCM is read")
        raw = np.frombuffer(source.readframes(source.getnframes()), dtype="<i2")
        samples = raw.reshape(-1, source.getnchannels()).T.astype(np.float32) / 32767.0
        return AudioTrack(np.ascontiguousarray(samples), source.getframerate())


def check_muxable(track: AudioTrack, container_format: str, path: Path) -> None:
    """InvalidRequest("output") if `container_format` cannot carry this track, before anything is encoded."""
    if container_format not in AUDIO_CODECS:
        raise InvalidRequest("output", f"{path.name}: this format carries no sound; use .mp4 or .webm "
                                       "(or write the audio separately as .wav)")
    codec, _, rates = AUDIO_CODECS[container_format]
    if track.sample_rate not in rates:
        raise InvalidRequest("output", f"{path.name}: {codec} cannot encode {track.sample_rate} Hz audio "
                                       f"(it takes {', '.join(map(str, rates))}); write the audio as .wav")


class AudioStreamWriter:
    """Encodes one track into an open PyAV output container, interleaved with the video by time."""

    def __init__(self, container: Any, track: AudioTrack, container_format: str, seconds: float) -> None:
        codec, bit_rate, _ = AUDIO_CODECS[container_format]
        self._container = container
        self._rate = track.sample_rate
        self._samples = np.ascontiguousarray(np.clip(track.fitted(seconds), -1.0, 1.0), dtype=np.float32)
        self._layout = LAYOUTS[self._samples.shape[0]]
        self._stream = container.add_stream(codec, rate=track.sample_rate, layout=self._layout)
        self._stream.bit_rate = bit_rate
        self._stream.options = {"threads": "1"}
        self._done = 0  # samples handed to the encoder so far

    def mux_until(self, seconds: float) -> None:
        """Encode the samples that play before `seconds` (call after each video frame, and with the end)."""
        import av  # on first use: `import vidloom` works without PyAV (the GPU image lacks it)
        stop = min(self._samples.shape[1], round(seconds * self._rate))
        if stop <= self._done:
            return
        chunk = self._samples[:, self._done:stop]
        if self._stream.codec_context.format.name == "flt":  # packed (Opus): [1, samples * channels]
            frame = av.AudioFrame.from_ndarray(chunk.T.reshape(1, -1).copy(), format="flt", layout=self._layout)
        else:  # planar float (AAC): one row per channel
            frame = av.AudioFrame.from_ndarray(chunk.copy(), format="fltp", layout=self._layout)
        frame.sample_rate, frame.pts = self._rate, self._done
        for packet in self._stream.encode(frame):
            self._container.mux(packet)
        self._done = stop

    def finish(self) -> None:
        self.mux_until(self._samples.shape[1] / self._rate)
        for packet in self._stream.encode(None):
            self._container.mux(packet)


def read_audio_stream(path: Path) -> AudioTrack:
    """Decode the first audio stream of a media file to float32 [channels, samples] (encoder priming removed
    where the container records it)."""
    import av  # on first use: `import vidloom` works without PyAV (the GPU image lacks it)
    with av.open(str(path)) as container:
        if not container.streams.audio:
            raise ValueError(f"{path}: no audio stream")
        return decode_audio_stream(container, container.streams.audio[0])


def decode_audio_stream(container: Any, stream: Any) -> AudioTrack:
    """Every sample of `stream` (an audio stream of the open PyAV `container`) as float32 [channels, samples]."""
    chunks = [frame.to_ndarray() for frame in container.decode(stream)]
    if not chunks:
        raise ValueError("no audio samples")
    rate = stream.codec_context.sample_rate
    planar = stream.codec_context.format.is_planar
    channels = stream.codec_context.channels
    samples = np.concatenate(chunks, axis=1) if planar else np.concatenate(
        [c.reshape(-1, channels).T for c in chunks], axis=1)
    return AudioTrack(_full_scale(samples), rate)


def _full_scale(samples: np.ndarray) -> np.ndarray:
    """Decoded samples as float32 in [-1, 1]: lossless codecs (FLAC, PCM) decode to integers (s16, s32, u8),
    scaled by their largest value as read_wav scales 16-bit PCM (x / 32767), so a FLAC and a WAV of one
    waveform read back equal."""
    if samples.dtype.kind == "i":
        return samples.astype(np.float32) / np.float32(np.iinfo(samples.dtype).max)
    if samples.dtype.kind == "u":  # unsigned PCM is offset by half its range
        half = np.iinfo(samples.dtype).max // 2 + 1
        return (samples.astype(np.float32) - half) / np.float32(half - 1)
    return samples.astype(np.float32)
