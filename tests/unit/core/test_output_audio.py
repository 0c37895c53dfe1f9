"""VideoOutput's audio fields: what it accepts, what it refuses (naming the problem), and what save writes."""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np
import pytest
import torch

from vidloom.core.errors import InvalidRequest
from vidloom.core.output import VideoOutput
from vidloom.media.audio import read_wav
from vidloom.media.output import save_output
from vidloom.runtime.results import output_audio

FRAMES = np.zeros((5, 16, 16, 3), dtype=np.uint8)


def _audio(channels: int = 2, samples: int = 4000) -> np.ndarray:
    return (0.1 * np.random.default_rng(1).standard_normal((channels, samples))).astype(np.float32)


def test_audio_and_rate_are_kept():
    out = VideoOutput(FRAMES, 24, audio=_audio(), sample_rate=24000)
    assert out.audio.shape == (2, 4000) and out.sample_rate == 24000 and out.duration_s == 5 / 24
    silent = VideoOutput(FRAMES, 24)
    assert silent.audio is None and silent.sample_rate is None


def test_a_float32_tensor_is_stored_as_numpy():
    out = VideoOutput(FRAMES, 24, audio=torch.from_numpy(_audio(1)), sample_rate=np.int64(16000))
    assert isinstance(out.audio, np.ndarray) and out.audio.dtype == np.float32
    assert type(out.sample_rate) is int


@pytest.mark.parametrize("audio, rate, message", [
    (None, 24000, "sample_rate was given without the other"),
    (_audio(), None, "audio was given without the other"),
    (_audio().astype(np.float64), 24000, "float32, got float64"),
    (torch.zeros(2, 10, dtype=torch.bfloat16), 24000, "float32, got torch.bfloat16"),
    (_audio()[0], 24000, r"\[channels, samples\].*shape \(4000,\)"),
    (_audio(3), 24000, r"1..2 channels.*shape \(3, 4000\)"),
    (np.zeros((2, 0), np.float32), 24000, "at least one sample"),
    (np.array([[0.0, np.nan, np.inf]], np.float32), 24000, "2 non-finite samples"),
    (_audio(), 0, "positive integer"),
    (_audio(), 24000.5, "positive integer"),
    (_audio(), True, "positive integer"),
    ([[0.0, 0.1]], 24000, "float32 array"),
])
def test_bad_audio_is_refused_naming_the_problem(audio, rate, message):
    with pytest.raises(ValueError, match=message):
        VideoOutput(FRAMES, 24, audio=audio, sample_rate=rate)


def test_save_muxes_sound_into_mp4_and_writes_wav(tmp_path: Path):
    out = VideoOutput(FRAMES, 24, audio=_audio(), sample_rate=24000, writer=save_output)
    with av.open(str(out.save(tmp_path / "x.mp4"))) as container:
        assert len(container.streams.video) == 1 and container.streams.audio[0].codec_context.name == "aac"
    wav = read_wav(out.save(tmp_path / "x.wav"))
    assert wav.sample_rate == 24000 and wav.samples.shape == (2, round(5 / 24 * 24000))


def test_save_wav_without_audio_is_refused(tmp_path: Path):
    with pytest.raises(InvalidRequest, match="no audio"):
        VideoOutput(FRAMES, 24, writer=save_output).save(tmp_path / "x.wav")
    assert list(tmp_path.iterdir()) == []


def test_program_audio_slot_becomes_output_audio():
    waveform = torch.randn(1, 2, 300)
    audio, rate = output_audio({"audio": waveform, "sample_rate": 24000})
    assert audio.shape == (2, 300) and audio.dtype == np.float32 and rate == 24000
    assert np.array_equal(audio, waveform[0].numpy())
    assert output_audio({"video": np.zeros(1)}) == (None, None)


def test_cli_progress_keeps_the_denoise_step_through_decode_and_audio_phases():
    from vidloom.cli.progress import ProgressBars
    from vidloom.core.output import ProgressEvent

    bars = ProgressBars()
    with bars:
        for phase, step, total in [("denoise", 3, 4), ("decode", 1, 2), ("audio", 1, 1)]:
            bars(ProgressEvent("r", phase, step, total))
    assert bars.last_denoise == (3, 4)  # what "cancelled at step k/n" reports


def test_an_output_without_a_writer_says_how_to_write_it(tmp_path: Path):
    with pytest.raises(RuntimeError, match="save_output"):
        VideoOutput(FRAMES, 24).save(tmp_path / "x.mp4")
    assert save_output(VideoOutput(FRAMES, 24), tmp_path / "x.mp4").stat().st_size > 0
