"""Chat video parts (`video_url`): an MP4 or WebM checked from its container, its frames decoded only when sampled.

The boundary (planning, on the media pool) checks the file as uploaded videos are checked (media.uploads.probe_video:
container, codec, frame size, exact frame count) plus its duration, and decodes its sound track when the part asks
for it (use_audio_in_video: 16 kHz mono, as chat audio parts); the model's preprocessing later decodes the frames it
samples (`ChatVideo.frames`). Limits are named settings: MAX_CHAT_VIDEO_SECONDS, MAX_CHAT_VIDEO_FRAMES, and the
upload limits probe_video applies (MAX_MEDIA_PIXELS per frame, MAX_VIDEO_PIXELS in all).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from vidloom.core.chat import INPUT_AUDIO_RATE
from vidloom.core.errors import InvalidRequest, LimitExceeded
from vidloom.media.decode_errors import decode_reason
from vidloom.media.uploads import EncodedVideo, probe_video

# The longest chat video, seconds: its sound track must fit the audio encoders' feature window (Qwen-Omni's
# Whisper feature extractor reads at most 300 s, media.audio_upload.MAX_INPUT_AUDIO_SECONDS).
MAX_CHAT_VIDEO_SECONDS = 300.0
# Frames sampled per second of a chat video (qwen-omni-utils' FPS; transformers' video processors take it as `fps`).
CHAT_VIDEO_FPS = 2.0
MIN_SAMPLED_FRAMES = 4  # Qwen2VLVideoProcessor's min_frames: a short video is sampled denser
MAX_CHAT_VIDEO_FRAMES = 18000  # frames in the file (300 s at 60 fps): every one is decoded to reach the sampled ones
# Sound track codecs read from a video container (FFmpeg decoder names).
VIDEO_AUDIO_CODECS = frozenset({"aac", "mp3", "mp3float", "opus", "libopus", "vorbis", "libvorbis", "flac"})


@dataclass(frozen=True, eq=False)
class ChatVideo:
    """A checked video file, its frame rate and (when asked for) its sound track; frames not decoded yet."""

    encoded: EncodedVideo  # the file's bytes, frame size and exact frame count
    fps: float  # the stream's average frame rate
    audio: np.ndarray | None = None  # float32 mono [samples] at INPUT_AUDIO_RATE: use_audio_in_video

    @property
    def size(self) -> tuple[int, int]:
        return self.encoded.size

    @property
    def frame_count(self) -> int:
        return self.encoded.frames

    def frames(self, indices: Sequence[int]) -> np.ndarray:
        """The frames at `indices` (ascending, within frame_count) as uint8 RGB [n, height, width, 3]."""
        import av

        wanted, out = list(indices), []
        video, field = self.encoded, self.encoded.field
        try:
            with av.open(io.BytesIO(video.source), format=video.demuxer) as container:
                for i, frame in enumerate(container.decode(video=0)):
                    if len(out) == len(wanted):
                        break
                    if (frame.width, frame.height) != video.size:
                        raise InvalidRequest(field, f"frame {i} is {frame.width}x{frame.height} but the stream "
                                                    f"header says {video.size[0]}x{video.size[1]}")
                    while len(out) < len(wanted) and wanted[len(out)] == i:  # an index may repeat
                        out.append(frame.to_ndarray(format="rgb24"))
        except InvalidRequest:
            raise
        except (av.error.FFmpegError, ValueError, IndexError, OSError) as exc:
            raise InvalidRequest(field, f"is not a readable video ({decode_reason(exc)})") from None
        if len(out) < len(wanted):
            raise InvalidRequest(field, f"decoded to fewer frames than its container holds ({video.frames})")
        return np.stack(out)


def load_chat_video(data: bytes, field: str, with_audio: bool = False) -> ChatVideo:
    """A chat video part's file checked from its container (and its sound track decoded when `with_audio`);
    InvalidRequest(field) naming what is wrong or the limit passed."""
    encoded = probe_video(data, field, MAX_CHAT_VIDEO_FRAMES)
    fps, seconds = _rate_and_seconds(encoded, field)
    if seconds > MAX_CHAT_VIDEO_SECONDS:
        raise LimitExceeded(field, f"lasts {seconds:.3f} s; a chat video may last at most {MAX_CHAT_VIDEO_SECONDS:g} s "
                                   "(MAX_CHAT_VIDEO_SECONDS)", "MAX_CHAT_VIDEO_SECONDS")
    return ChatVideo(encoded, fps, _sound_track(encoded, field) if with_audio else None)


def chat_video_header(data: bytes, field: str) -> tuple[tuple[int, int], float]:
    """(frame size, seconds) a video file's headers state, read without decoding or counting frames (sizing a
    chat's media before planning); InvalidRequest(field) when it is not a readable MP4 or WebM."""
    import av

    from vidloom.media.upload_formats import VIDEO_UPLOAD, sniffed_format

    fmt = sniffed_format(data, field, VIDEO_UPLOAD, "video")
    try:
        with av.open(io.BytesIO(data), format=fmt.demuxer) as container:
            if not container.streams.video:
                raise InvalidRequest(field, "has no video stream")
            context = container.streams.video[0].codec_context
            seconds = 0.0 if container.duration is None else container.duration / av.time_base
            return (context.width, context.height), seconds
    except InvalidRequest:
        raise
    except (av.error.FFmpegError, ValueError, IndexError, OSError) as exc:
        raise InvalidRequest(field, f"is not a readable video ({decode_reason(exc)})") from None


def sampled_bytes(size: tuple[int, int], seconds: float, with_audio: bool) -> int:
    """What a chat video of `size` lasting `seconds` holds once sampled: its RGB frames at CHAT_VIDEO_FPS (at least
    MIN_SAMPLED_FRAMES) and, with its sound track, float32 samples at INPUT_AUDIO_RATE."""
    frames = max(MIN_SAMPLED_FRAMES, int(seconds * CHAT_VIDEO_FPS) + 1)
    return frames * size[0] * size[1] * 3 + (int(seconds * INPUT_AUDIO_RATE) * 4 if with_audio else 0)


def _rate_and_seconds(video: EncodedVideo, field: str) -> tuple[float, float]:
    import av

    with av.open(io.BytesIO(video.source), format=video.demuxer) as container:
        rate = container.streams.video[0].average_rate
    if not rate or float(rate) <= 0:
        raise InvalidRequest(field, "states no frame rate in its stream header")
    return float(rate), video.frames / float(rate)


def _sound_track(video: EncodedVideo, field: str) -> np.ndarray:
    """The file's first audio stream, mixed to mono and resampled to INPUT_AUDIO_RATE."""
    import av

    from vidloom.media.audio_upload import _resampled, joined_samples  # PyAV's: only when a sound track is read

    try:
        with av.open(io.BytesIO(video.source), format=video.demuxer) as container:
            if not container.streams.audio:
                raise InvalidRequest(field, "has no audio stream (use_audio_in_video needs one)")
            stream = container.streams.audio[0]
            if stream.codec_context.name not in VIDEO_AUDIO_CODECS:
                raise InvalidRequest(field, f"has {stream.codec_context.name!r} audio; a video's sound track may be "
                                            f"{', '.join(sorted(VIDEO_AUDIO_CODECS))}")
            pieces = list(_resampled(container, stream, INPUT_AUDIO_RATE, field, "video"))
    except InvalidRequest:
        raise
    except (av.error.FFmpegError, ValueError, IndexError, OSError) as exc:
        raise InvalidRequest(field, f"is not a readable video ({decode_reason(exc)})") from None
    return joined_samples(pieces, field)
