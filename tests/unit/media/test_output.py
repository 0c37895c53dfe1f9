"""Writers by extension, permissions, atomicity and reproducible encodes."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import numpy as np
import pytest

from vidloom.core.errors import InvalidRequest
from vidloom.media.output import check_output_frames, check_output_path, write_output
from vidloom.media.video import read_video, write_video


def _frames(count: int = 5, height: int = 32, width: int = 48, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = np.linspace(0, 1, width)[None, None, :, None]
    y = np.linspace(0, 1, height)[None, :, None, None]
    t = np.arange(count)[:, None, None, None] / count
    image = 0.5 + 0.5 * np.sin(6 * x + 3 * y + 2 * t + rng.random(3) * 6)
    return (image * 255).astype(np.uint8)


@pytest.mark.parametrize("suffix, codec, tolerance", [(".mp4", "h264", 8.0), (".webm", "vp9", 8.0), (".gif", "gif", 16.0)])
def test_extension_picks_the_codec(tmp_path, suffix, codec, tolerance):
    import av

    frames = _frames()
    [path] = write_output(frames, 8, tmp_path / f"clip{suffix}")
    with av.open(str(path)) as container:
        assert container.streams.video[0].codec_context.name == codec
    decoded, _ = read_video(path)
    assert decoded.shape == frames.shape
    # lossy codecs: mean error bound chosen well above what each codec gives here (mp4 ~4, gif ~11)
    assert np.abs(decoded.astype(int) - frames).mean() < tolerance


def test_png_is_one_frame_or_a_numbered_sequence(tmp_path):
    frames = _frames(count=3)
    assert write_output(frames[:1], 8, tmp_path / "one.png") == [tmp_path / "one.png"]
    paths = write_output(frames, 8, tmp_path / "seq.png")
    assert [p.name for p in paths] == ["seq_0000.png", "seq_0001.png", "seq_0002.png"]
    for path, frame in zip(paths, frames):
        decoded, _ = read_video(path)
        assert np.array_equal(decoded[0], frame)  # PNG is lossless
    assert not (tmp_path / "seq.png").exists()


@pytest.mark.parametrize("name", ["clip.avi", "clip", "clip.MP3"])
def test_unknown_extension_is_refused_naming_output(tmp_path, name):
    with pytest.raises(InvalidRequest) as info:
        check_output_path(tmp_path / name)
    assert info.value.field == "output" and ".mp4" in info.value.message
    assert list(tmp_path.iterdir()) == []


def test_directory_and_unwritable_outputs_are_refused(tmp_path):
    with pytest.raises(InvalidRequest, match="is a directory"):
        check_output_path(tmp_path)
    with pytest.raises(InvalidRequest, match="cannot create a file in"):
        check_output_path(Path("/proc/x.mp4"))
    check_output_path(tmp_path / "ok.mp4")
    assert list(tmp_path.iterdir()) == []  # the probe leaves nothing


def test_a_missing_directory_is_refused_not_created(tmp_path):
    """As ffmpeg does ("No such file or directory"): a typo in a path must not create folders."""
    with pytest.raises(InvalidRequest, match="new/dir does not exist") as info:
        check_output_path(tmp_path / "new" / "dir" / "ok.mp4")
    assert info.value.field == "output"
    with pytest.raises(InvalidRequest, match="is not a directory"):
        (tmp_path / "file").write_bytes(b"")
        check_output_path(tmp_path / "file" / "ok.mp4")
    assert [p.name for p in tmp_path.iterdir()] == ["file"]


@pytest.mark.parametrize("suffix", [".jpg", ".jpeg", ".webp", ".JPG"])
def test_still_formats_take_one_frame_checked_before_any_frame_exists(tmp_path, suffix):
    check_output_frames(tmp_path / f"one{suffix}", 1)
    with pytest.raises(InvalidRequest, match="holds one image, this request makes 81 frames") as info:
        check_output_frames(tmp_path / f"many{suffix}", 81)
    assert info.value.field == "output"
    for other in (".mp4", ".webm", ".gif", ".png"):
        check_output_frames(tmp_path / f"v{other}", 81)


@pytest.mark.parametrize("suffix", [".mp4", ".webm", ".gif", ".png"])
def test_files_get_umask_permissions(tmp_path, suffix):
    old = os.umask(0o022)
    try:
        [path, *_] = write_output(_frames(count=1), 8, tmp_path / f"out{suffix}")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_failed_png_sequence_leaves_no_file(tmp_path, monkeypatch):
    import vidloom.media.output as output

    calls = {"n": 0}
    real = Path.write_bytes

    def failing(self: Path, data: bytes) -> int:
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError("disk full")
        return real(self, data)

    monkeypatch.setattr(Path, "write_bytes", failing)
    with pytest.raises(OSError, match="disk full"):
        output.write_output(_frames(count=3), 8, tmp_path / "seq.png")
    assert list(tmp_path.iterdir()) == []


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("container_format", ["mp4", "webm"])
def test_encode_a_b_a_in_one_process_gives_identical_bytes(tmp_path, container_format, demo_cache):
    """Issue 17: encoding A, then B, then A again gave different bytes for A within one process.

    Torch work between the encodes (as in a server) is part of the reproduction: before the fix
    the second A differed on most runs after a generation.
    """
    from vidloom import VideoGenerator

    generator = VideoGenerator.from_pretrained("wan2.1-demo", device="cpu", cache_dir=demo_cache)
    a = generator.generate("a cat", height=48, width=64, num_frames=9, num_inference_steps=1, seed=1).frames
    suffix = f".{container_format}"
    first = _digest(write_video(a, 8, tmp_path / f"a1{suffix}", container_format=container_format))
    for round_ in range(3):
        b = generator.generate("a dog", height=64, width=96, num_frames=5, num_inference_steps=1, seed=2 + round_)
        write_video(b.frames, 16, tmp_path / f"b{suffix}", container_format=container_format)
        again = _digest(write_video(a, 8, tmp_path / f"a2{suffix}", container_format=container_format))
        assert again == first, f"round {round_}"


@pytest.mark.parametrize("fps, count", [(8, 16), (8, 17), (16, 17), (24, 25), (30, 31), (7, 5), (5, 4)])
def test_gif_frames_last_1000_over_fps_ms(tmp_path, fps, count):
    """GIF delays are whole centiseconds: read back with PIL, each frame ends within 5 ms of (i+1)*1000/fps
    and its delay is 1000/fps rounded down or up to 10 ms (8 fps: 130, 120, 130, ... not 130 throughout)."""
    from PIL import Image

    [path] = write_output(_frames(count, 16, 16), fps, tmp_path / "clip.gif")
    with Image.open(path) as image:
        delays = []
        for index in range(image.n_frames):
            image.seek(index)
            delays.append(image.info["duration"])
    assert len(delays) == count
    period = 1000 / fps
    assert all(10 * (period // 10) <= delay <= 10 * (period // 10 + 1) for delay in delays), delays
    ends = np.cumsum(delays)
    assert np.all(np.abs(ends - period * np.arange(1, count + 1)) <= 5), delays
    if count * 100 % fps == 0:  # a whole number of centiseconds in all: exact
        assert ends[-1] == count * period
