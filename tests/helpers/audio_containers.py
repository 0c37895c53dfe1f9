"""Audio in the containers and codecs an upload may hold (or must not), encoded in memory with PyAV."""

from __future__ import annotations

import io

import numpy as np

# name -> (container, audio codec, with a video stream): what tests feed to the upload checks
ENCODINGS = {
    "wav": ("wav", "pcm_s16le", False),
    "mp3": ("mp3", "libmp3lame", False),
    "flac": ("flac", "flac", False),
    "opus": ("ogg", "libopus", False),
    "m4a": ("mp4", "aac", False),
    "adts": ("adts", "aac", False),
    "mp4_video": ("mp4", "aac", True),
    "wav_holding_mp3": ("wav", "libmp3lame", False),
}


def encoded_audio(name: str, seconds: float = 1.0, rate: int = 16000, bit_rate: int | None = None) -> bytes:
    """A mono tone of `seconds` encoded as ENCODINGS[name] (Opus at 48 kHz, the rate it takes), at the codec's
    default bit rate or `bit_rate`."""
    import av

    container_format, codec, video = ENCODINGS[name]
    rate = 48000 if codec == "libopus" else rate
    tone = (0.5 * np.sin(np.arange(int(seconds * rate)) * 0.05)).astype(np.float32)
    buffer = io.BytesIO()
    with av.open(buffer, "w", format=container_format) as container:
        picture = _video_stream(container) if video else None
        stream = container.add_stream(codec, rate=rate, layout="mono")
        if bit_rate is not None:
            stream.bit_rate = bit_rate
        sample_format = stream.codec_context.format.name
        for start in range(0, tone.shape[0], 1024):
            chunk = tone[None, start:start + 1024]
            if sample_format not in ("flt", "fltp"):
                chunk, sample_format = (chunk * 32767).astype(np.int16), "s16"
            frame = av.AudioFrame.from_ndarray(chunk, format=sample_format, layout="mono")
            frame.sample_rate, frame.pts = rate, start
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
        if picture is not None:
            _mux_frames(container, picture)
    return buffer.getvalue()


def _video_stream(container):
    stream = container.add_stream("libx264", rate=8)
    stream.width, stream.height, stream.pix_fmt = 32, 32, "yuv420p"
    return stream


def _mux_frames(container, stream) -> None:
    import av

    frame = av.VideoFrame.from_ndarray(np.zeros((32, 32, 3), np.uint8), format="rgb24")
    for _ in range(4):
        for packet in stream.encode(frame):
            container.mux(packet)
    for packet in stream.encode(None):
        container.mux(packet)
