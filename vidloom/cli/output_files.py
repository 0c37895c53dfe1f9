"""`vidloom generate`'s files: the video (or image sequence, or waveform), --audio-out and --actions-out, written
all or nothing around a Ctrl-C (cli/interrupt.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from vidloom.cli.actions import write_actions


def write_files(video: Any, output: Path, audio_out: Path | None, actions_out: Path | None,
                settle: Callable[[], bool]) -> list[Path] | None:
    """--audio-out (first, so a model that unexpectedly made no sound leaves no video either), the output, then
    --actions-out; then `settle()` fixes the command's outcome. Returns every file written, the actions last.

    All or nothing, decided at one point: a Ctrl-C before `settle()` marks the outcome (during an encode, between
    two files, or just after the last rename) removes the files this call put in place (each writer removes its
    own temp file) and the command exits 130: returns None, or re-raises a KeyboardInterrupt raised meanwhile.
    From that point on a Ctrl-C is ignored: the files are whole and the command reports them (exit 0). A failed
    write (a full disk) removes them too.
    """
    from vidloom.media.audio import track_of
    from vidloom.media.output import png_sequence_paths, write_audio_file, write_output

    targets = ([audio_out] if audio_out is not None else []) + (
        png_sequence_paths(output, len(video.frames)) if output.suffix.lower() == ".png" else [output])
    targets += [actions_out] if actions_out is not None else []
    before = {path: _identity(path) for path in targets}
    if actions_out is not None:  # written in place, not renamed: an old file there is gone either way
        before[actions_out] = None
    try:
        written = []
        if audio_out is not None:
            written.append(write_audio_file(track_of(video.audio, video.sample_rate), video.duration_s, audio_out,
                                            field="audio_out"))
        written += write_output(video.frames, video.fps, output, audio=video.audio, sample_rate=video.sample_rate)
        if actions_out is not None:
            written.append(write_actions(actions_out, video.actions, video.metadata))
        # Inside the try: a KeyboardInterrupt raised after the last rename, up to the moment settle() marks the
        # outcome, still takes the files with it (outside it, the command exited 130 with the file in place).
        if not settle():
            return written
    except BaseException:
        _remove_written(targets, before)
        raise
    _remove_written(targets, before)  # a Ctrl-C came while writing, its KeyboardInterrupt swallowed by a library
    return None


def _remove_written(targets: list[Path], before: dict[Path, tuple[int, int] | None]) -> None:
    for path in targets:  # replaced by this call (a new inode), or new: not the user's old file
        if _identity(path) not in (None, before[path]):
            path.unlink(missing_ok=True)


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return stat.st_dev, stat.st_ino
