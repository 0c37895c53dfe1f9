"""Choosing a writer from the output file's extension, and checking the path before any work."""

from __future__ import annotations

import os
import tempfile
from contextlib import ExitStack
from pathlib import Path

import numpy as np

from vidloom.core.errors import InvalidRequest
from vidloom.core.output import VideoOutput
from vidloom.media.atomic import atomic_path
from vidloom.media.audio import AudioTrack, track_of, write_wav
from vidloom.media.video import encode_png, write_gif, write_video

# Extension -> what gets written. Anything else is refused before generation.
OUTPUT_FORMATS: dict[str, str] = {
    ".mp4": "H.264 video",
    ".webm": "VP9 video",
    ".gif": "animated GIF",
    ".png": "PNG (one frame; a numbered sequence for several)",
    ".jpg": "JPEG (one frame: image models)",
    ".jpeg": "JPEG (one frame: image models)",
    ".webp": "WebP (one frame: image models)",
    ".wav": "WAV audio, 16-bit PCM (models that make sound)",
}
STILL_FORMATS = {".jpg": "jpeg", ".jpeg": "jpeg", ".webp": "webp"}
"""Extensions that hold exactly one image (-> the encoder's format name)."""
SOUND_FORMATS = (".mp4", ".webm", ".wav")
"""Extensions whose files carry an output's audio; the others hold frames only."""
AUDIO_ONLY_FORMATS: dict[str, str] = {".wav": "WAV audio, 16-bit PCM"}
"""What --audio-out (an output's sound, written on its own) accepts."""


def check_output_path(path: Path, field: str = "output", formats: dict[str, str] = OUTPUT_FORMATS) -> None:
    """Raise InvalidRequest(field) unless a file could be written at `path`; leaves nothing behind.

    Checked before a model loads: the extension is one of `formats`, the path is not a
    directory, its directory exists and accepts a new file. A missing directory is refused,
    as ffmpeg refuses it ("No such file or directory"): a typo in a path should not quietly
    create a tree of folders.
    """
    if path.is_dir():
        example = "out.mp4" if ".mp4" in formats else f"out{next(iter(formats))}"
        raise InvalidRequest(field, f"{path} is a directory; give a file name such as {path / example}")
    suffix = path.suffix.lower()
    if suffix not in formats:
        known = ", ".join(formats)
        raise InvalidRequest(field, f"{path}: unsupported extension {suffix or '(none)'!r}; use one of {known}")
    parent = path.parent
    if not parent.is_dir():
        why = "is not a directory" if parent.exists() else "does not exist (create it first)"
        raise InvalidRequest(field, f"{path}: {parent} {why}")
    try:  # os.access says yes to root on read-only mounts and /proc: probe with a real file
        fd, probe = tempfile.mkstemp(prefix=".vidloom-probe.", dir=parent)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise InvalidRequest(field, f"{path}: cannot create a file in {parent} ({exc.strerror or exc})") from None


def check_output_frames(path: Path, num_frames: int, field: str = "output") -> None:
    """Raise InvalidRequest(field) if `path` holds one image (.jpg, .webp) and the output will have
    `num_frames` > 1; checked with the resolved request, before a model loads."""
    fmt = STILL_FORMATS.get(path.suffix.lower())
    if fmt is not None and num_frames != 1:
        raise InvalidRequest(field, f"{path.name}: {fmt} holds one image, this request makes {num_frames} frames; "
                                    "use .mp4, .webm, .gif or .png, or ask for 1 frame")


def save_output(output: VideoOutput, path: Path) -> Path:
    """VideoOutput's writer (see VideoOutput.save): its frames and sound by `path`'s extension; the first file."""
    return write_output(output.frames, output.fps, Path(path), audio=output.audio, sample_rate=output.sample_rate)[0]


def write_output(frames: np.ndarray, fps: int, path: Path, audio: np.ndarray | None = None,
                 sample_rate: int | None = None) -> list[Path]:
    """Write uint8 frames [F, H, W, 3] (and, in .mp4 / .webm, the audio [channels, samples] at `sample_rate`)
    in the format `path`'s extension names; .wav writes the audio alone. An output without frames (a
    text-to-audio model's) is audio only: .wav, .flac, .mp3 or .ogg, whole. Returns the files written."""
    if len(frames) == 0:
        from vidloom.media.audio_files import AUDIO_FILE_FORMATS, write_audio_only

        check_output_path(path, formats=AUDIO_FILE_FORMATS)
        return [write_audio_only(track_of(audio, sample_rate), path)]
    check_output_path(path)
    suffix = path.suffix.lower()
    track = track_of(audio, sample_rate)
    if suffix == ".wav":  # fitted to the video
        return [write_audio_file(track, len(frames) / fps, path)]
    if suffix == ".mp4":
        return [write_video(frames, fps, path, container_format="mp4", audio=track)]
    if suffix == ".webm":
        return [write_video(frames, fps, path, container_format="webm", audio=track)]
    if suffix == ".gif":
        return [write_gif(frames, fps, path)]
    if suffix in STILL_FORMATS:
        return [write_still(frames, path, STILL_FORMATS[suffix])]
    return write_png_frames(frames, path)


def write_audio_file(track: AudioTrack | None, seconds: float | None, path: Path, field: str = "output") -> Path:
    """The output's sound alone as WAV, lasting `seconds` (the video's duration; None: all of it);
    InvalidRequest(field) if the output has no audio."""
    if track is None:
        raise InvalidRequest(field, f"{path.name}: this output has no audio (the model makes no sound); "
                                    "write the video as .mp4 instead")
    return write_wav(track, path, seconds)


def write_still(frames: np.ndarray, path: Path, fmt: str) -> Path:
    """A one-frame output as JPEG or WebP (these formats hold no sequence: several frames are refused)."""
    from vidloom.media.image import encode_image

    check_output_frames(path, len(frames))
    with atomic_path(path) as tmp:
        tmp.write_bytes(encode_image(frames[0], fmt))
    return path


def png_sequence_paths(path: Path, count: int) -> list[Path]:
    """`out.png` for one frame; `out_0000.png`, `out_0001.png`, ... for several."""
    if count == 1:
        return [path]
    digits = max(4, len(str(count - 1)))
    return [path.with_name(f"{path.stem}_{index:0{digits}d}{path.suffix}") for index in range(count)]


def write_png_frames(frames: np.ndarray, path: Path) -> list[Path]:
    """One PNG per frame, all or nothing: every file is encoded to a temp file before any is renamed."""
    paths = png_sequence_paths(path, len(frames))
    encoded = [encode_png(frame) for frame in frames]
    with ExitStack() as stack:  # on error every temp file is removed; on success all are renamed
        for final, data in zip(paths, encoded):
            stack.enter_context(atomic_path(final)).write_bytes(data)
    return paths
