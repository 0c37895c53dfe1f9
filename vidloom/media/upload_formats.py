"""Uploaded media checked against the formats a field takes before any demuxer runs.

FFmpeg probes a file by its content and has hundreds of demuxers and decoders: a chat part labelled wav must not
reach its MP4, Matroska or AAC parsers. So a file's first bytes (its magic number) must name a container the field
allows, FFmpeg is then told that one demuxer (it never probes), and the stream it reads must use a codec on the
container's allow list. Images are PIL's: an upload opens only with the image formats a field takes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from vidloom.core.errors import InvalidRequest


@dataclass(frozen=True)
class MediaFormat:
    """A container a field takes: how to recognise it, the FFmpeg demuxer it is opened with, the codecs read."""

    name: str  # what errors say, and the chat's `input_audio.format` value
    demuxer: str  # FFmpeg's demuxer (av.open(format=...)): never probed from the content
    codecs: frozenset[str]  # FFmpeg decoder names a read stream may use
    matches: Callable[[bytes], bool]


def _is_mp3(head: bytes) -> bool:
    """An ID3v2 tag, or an MPEG audio frame sync whose layer bits are not 00 (00 is ADTS AAC's sync)."""
    if head[:3] == b"ID3":
        return True
    return len(head) >= 2 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0 and (head[1] >> 1) & 0x03 != 0


PCM = frozenset({"pcm_u8", "pcm_s16le", "pcm_s24le", "pcm_s32le", "pcm_f32le", "pcm_f64le"})
WAV = MediaFormat("wav", "wav", PCM, lambda h: h[:4] in (b"RIFF", b"RF64") and h[8:12] == b"WAVE")
MP3 = MediaFormat("mp3", "mp3", frozenset({"mp3", "mp3float"}), _is_mp3)
FLAC = MediaFormat("flac", "flac", frozenset({"flac"}), lambda h: h[:4] == b"fLaC")
OGG = MediaFormat("ogg", "ogg", frozenset({"opus", "vorbis", "libopus", "libvorbis", "flac"}),
                  lambda h: h[:4] == b"OggS")
VIDEO_CODECS = frozenset({"h264", "hevc", "vp8", "vp9", "av1", "libdav1d", "libvpx", "libvpx-vp9", "libaom-av1"})
MP4 = MediaFormat("mp4", "mp4", VIDEO_CODECS, lambda h: h[4:8] == b"ftyp")  # ISO BMFF / QuickTime: ftyp first
WEBM = MediaFormat("webm", "matroska", VIDEO_CODECS, lambda h: h[:4] == b"\x1a\x45\xdf\xa3")  # EBML header

INPUT_AUDIO = {"wav": WAV, "mp3": MP3}  # chat input_audio: OpenAI's two formats, each as declared
INIT_AUDIO = (WAV, FLAC, MP3, OGG)  # /v1/audio/generations init_audio: what the docs list
VIDEO_UPLOAD = (MP4, WEBM)  # the video field: what vidloom itself writes (H.264 MP4, VP9 WebM) and their kin
IMAGE_UPLOAD = ("PNG", "JPEG", "WEBP")  # PIL format names an uploaded image may be


def declared_format(data: bytes, declared: str, field: str) -> MediaFormat:
    """The chat part's format when the bytes are that format; InvalidRequest(field) otherwise."""
    fmt = INPUT_AUDIO[declared]
    if not fmt.matches(data[:16]):
        raise InvalidRequest(field, f"does not start like a {declared} file (its format says {declared!r}; "
                                    "the data must be in the format it declares)")
    return fmt


def sniffed_format(data: bytes, field: str, allowed: tuple[MediaFormat, ...], what: str) -> MediaFormat:
    """The first of `allowed` whose magic number `data` starts with; InvalidRequest(field) naming them when none."""
    for fmt in allowed:
        if fmt.matches(data[:16]):
            return fmt
    names = ", ".join(f.name for f in allowed)
    raise InvalidRequest(field, f"is not a readable {what} (its first bytes are none of the {names} this server "
                                "reads)")


def check_codec(stream: Any, fmt: MediaFormat, field: str) -> None:
    """InvalidRequest(field) unless the opened `stream` (a PyAV stream) uses a codec `fmt` allows."""
    codec = stream.codec_context.codec.name
    if codec not in fmt.codecs:
        raise InvalidRequest(field, f"holds {codec!r} data; a {fmt.name} upload may hold "
                                    f"{', '.join(sorted(fmt.codecs))}")
