"""Atomic writes through the real writers: a failed or killed write never leaves a final file, and
its temp file is gone after recovery (mp4, png, and the job store's result files).

wav and fragmented MP4 writers do not exist yet; when they do, add them to WRITERS.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from vidloom.media import video
from vidloom.media.atomic import atomic_path, remove_stale_temps
from vidloom.media.video import read_video, write_png, write_video
from vidloom.serving.sqlite_job_store import SqliteJobStore as JobStore

REPO = Path(__file__).resolve().parents[3]
# 60 frames: libx264 holds back ~40 frames of lookahead, and PyAV opens the output file only when
# the first packet is muxed, so the failure at frame FAIL_AT comes after bytes reached the disk.
FRAMES = np.random.default_rng(0).integers(0, 256, (60, 16, 16, 3), dtype=np.uint8)
FAIL_AT = 55


def _partials(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.name.startswith("."))


class _FailingFrames(np.ndarray):
    """Frames that raise while the writer is half-way through them, as a full disk would."""

    def __iter__(self):
        for index in range(len(self)):
            if index == FAIL_AT:
                # The writer is mid-write: a temp file holds the first frames; the final path is untouched.
                assert _partials(self.folder) and _content(self.final) == self.before
                raise OSError("no space left on device")
            yield np.asarray(self[index])


def _failing(folder: Path, final: Path) -> np.ndarray:
    frames = FRAMES.copy().view(_FailingFrames)
    frames.folder, frames.final, frames.before = folder, final, _content(final)
    return frames


def _content(path: Path) -> bytes | None:
    return path.read_bytes() if path.exists() else None


def test_mp4_writer_raising_mid_write_leaves_no_final_and_no_temp(tmp_path):
    final = tmp_path / "clip.mp4"
    with pytest.raises(OSError, match="no space"):
        write_video(_failing(tmp_path, final), 8, final)
    assert not final.exists() and _partials(tmp_path) == []


def test_png_writer_raising_mid_write_leaves_no_final_and_no_temp(tmp_path, monkeypatch):
    final = tmp_path / "thumb.png"
    real_write = Path.write_bytes

    def write_then_fail(self, data):
        real_write(self, data[:20])  # what was on disk when the writer died
        assert self != final and not final.exists()
        raise OSError("no space left on device")

    monkeypatch.setattr(Path, "write_bytes", write_then_fail)
    with pytest.raises(OSError, match="no space"):
        write_png(FRAMES[0], final)
    monkeypatch.setattr(Path, "write_bytes", real_write)
    assert not final.exists() and _partials(tmp_path) == []
    write_png(FRAMES[0], final)
    assert final.read_bytes().startswith(b"\x89PNG") and _partials(tmp_path) == []


def test_failed_rewrite_keeps_the_previous_file(tmp_path):
    final = tmp_path / "clip.mp4"
    write_video(FRAMES, 8, final)
    before = final.read_bytes()
    with pytest.raises(OSError):
        write_video(_failing(tmp_path, final), 8, final)
    assert final.read_bytes() == before and _partials(tmp_path) == []


def test_atomic_path_itself(tmp_path):
    final = tmp_path / "out.bin"
    with pytest.raises(RuntimeError):
        with atomic_path(final) as tmp:
            tmp.write_bytes(b"half")
            raise RuntimeError("writer bug")
    assert not final.exists() and _partials(tmp_path) == []
    with atomic_path(final) as tmp:
        assert tmp.parent == final.parent and tmp != final and tmp.name.startswith(".")
        tmp.write_bytes(b"whole")
        assert not final.exists()  # nothing at the final path until the block succeeds
    assert final.read_bytes() == b"whole" and _partials(tmp_path) == []


# A child that starts a real write and stops half-way; the test SIGKILLs it there.
_CHILD = textwrap.dedent("""
    import sys, time
    import importlib.util
    from pathlib import Path
    import numpy as np

    # The real module, loaded from its file: importing the vidloom package would pull in torch (seconds).
    spec = importlib.util.spec_from_file_location("vidloom_media_video", sys.argv[3])
    video = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(video)

    kind, final = sys.argv[1], Path(sys.argv[2])
    frames = np.random.default_rng(0).integers(0, 256, (60, 16, 16, 3), dtype=np.uint8)

    class Stalling(np.ndarray):
        def __iter__(self):
            for index in range(len(self)):
                if index == 55:
                    print("WRITING", flush=True)
                    time.sleep(120)
                yield np.asarray(self[index])

    real_write = Path.write_bytes

    def write_and_stall(self, data):
        real_write(self, data[:20])
        print("WRITING", flush=True)
        time.sleep(120)

    if kind == "png":
        Path.write_bytes = write_and_stall
        video.write_png(frames[0], final)
    else:
        video.write_video(frames.view(Stalling), 8, final)
""")


def _kill_mid_write(kind: str, final: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen([sys.executable, "-c", _CHILD, kind, str(final), video.__file__], stdout=subprocess.PIPE, env=env)
    try:
        assert child.stdout.readline().strip() == b"WRITING"
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait(30)  # reaped: its pid no longer belongs to a live process


@pytest.mark.parametrize("kind", ["mp4", "png"])
def test_killed_writer_leaves_no_final_and_recovery_removes_its_temp(tmp_path, kind):
    final = tmp_path / f"out.{kind}"
    _kill_mid_write(kind, final)
    assert not final.exists()
    stale = _partials(tmp_path)
    assert len(stale) == 1 and stale[0].suffix == f".{kind}"  # the killed writer's temp, beside the final path
    assert stale[0].stat().st_size > 0  # it died with bytes written
    assert remove_stale_temps(tmp_path) == stale and _partials(tmp_path) == []


def test_next_write_to_the_same_path_removes_a_killed_writers_temp(tmp_path):
    final = tmp_path / "out.mp4"
    _kill_mid_write("mp4", final)
    other = tmp_path / "other.mp4"
    write_video(FRAMES, 8, other)
    assert len(_partials(tmp_path)) == 1  # another path's write leaves it alone
    write_video(FRAMES, 8, final)
    assert _partials(tmp_path) == [] and read_video(final)[0].shape == FRAMES.shape


def test_live_writers_temp_is_not_removed(tmp_path):
    final = tmp_path / "out.mp4"
    with atomic_path(final) as tmp:
        tmp.write_bytes(b"in progress")
        assert remove_stale_temps(tmp_path) == [] and tmp.exists()  # this process is alive


def test_job_store_recovery_after_a_killed_write(tmp_path):
    store = JobStore(tmp_path)
    job_id = "video_" + "0" * 32
    _kill_mid_write("mp4", store.video_path(job_id))
    assert not store.video_path(job_id).exists() and len(_partials(store.videos_dir)) == 1
    store.close()
    restarted = JobStore(tmp_path)
    restarted.recover(completed_at=0, code="server_restart", message="restarted")
    assert list(restarted.videos_dir.iterdir()) == []
    restarted.close()
