"""Sound in output files: WAV round trip, the AAC track of an MP4 (and Opus in WebM) against the waveform,
durations against the video's, and formats / rates that cannot carry it."""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np
import pytest

from vidloom.core.errors import InvalidRequest
from vidloom.media.audio import AudioTrack, read_audio_stream, read_wav, to_pcm16, write_wav
from vidloom.media.output import write_output
from vidloom.media.atomic import PARTIAL
from vidloom.media.video import read_video

FPS, FRAMES, RATE = 24, 25, 24000
AAC_FRAME = 1024  # samples per AAC frame: the unit the MP4 track's length is rounded to
# Codec tolerance, measured on the tones below at 192 kb/s (PyAV 18, ffmpeg's aac): SNR 41.6 dB with no lag
# (the decoder drops the encoder's priming samples, recorded in the MP4 edit list); max abs error 0.0092 inside,
# 0.097 in the first AAC frame (onset). 30 dB leaves room for encoder versions and still fails a track shifted
# by one sample (14.7 dB), a silent, channel-swapped or wrongly-rated one.
AAC_MIN_SNR_DB = 30.0


def _tones(samples: int, rate: int = RATE) -> np.ndarray:
    t = np.arange(samples) / rate
    left = 0.5 * np.sin(2 * np.pi * 440 * t) + 0.1 * np.sin(2 * np.pi * 3000 * t)
    right = 0.3 * np.sin(2 * np.pi * 660 * t)
    return np.stack([left, right]).astype(np.float32)


def _frames() -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, (FRAMES, 32, 48, 3), dtype=np.uint8)


def _snr_db(reference: np.ndarray, decoded: np.ndarray) -> float:
    error = decoded - reference
    return float(10 * np.log10((reference ** 2).sum() / (error ** 2).sum()))


def test_wav_round_trip_is_16_bit_pcm(tmp_path: Path):
    audio = _tones(3000)
    audio[0, :5] = [1.5, -1.5, 1.0, -1.0, 0.0]  # out of range clips to full scale
    written = write_wav(AudioTrack(audio, RATE), tmp_path / "a.wav")
    back = read_wav(written)
    assert back.sample_rate == RATE and back.samples.shape == audio.shape and back.samples.dtype == np.float32
    clipped = np.clip(audio, -1, 1)
    assert np.abs(back.samples - clipped).max() <= 0.5 / 32767 + 1e-7  # rounding to the nearest PCM step
    assert np.array_equal(to_pcm16(audio)[0, :4], [32767, -32767, 32767, -32767])
    with av.open(str(written)) as container:  # a file other tools read the same way
        stream = container.streams.audio[0]
        assert stream.codec_context.name == "pcm_s16le" and stream.codec_context.channels == 2


@pytest.mark.parametrize("samples", [25000 - 760, 25000, 25000 + 4000])  # short (LTX-2's case), exact, long
def test_wav_lasts_exactly_as_long_as_the_video(tmp_path: Path, samples: int):
    audio = _tones(samples)
    [path] = write_output(_frames(), FPS, tmp_path / "a.wav", audio=audio, sample_rate=RATE)
    back = read_wav(path).samples
    assert back.shape == (2, round(FRAMES / FPS * RATE))  # 25000
    kept = min(samples, back.shape[1])
    assert np.abs(back[:, :kept] - audio[:, :kept]).max() <= 0.5 / 32767 + 1e-7
    assert not back[:, kept:].any()  # padding is silence


@pytest.mark.parametrize("samples", [25000 - 760, 25000 + 4000])
def test_mp4_audio_track_decodes_to_the_waveform(tmp_path: Path, samples: int):
    audio = _tones(samples)
    [path] = write_output(_frames(), FPS, tmp_path / "v.mp4", audio=audio, sample_rate=RATE)
    frames, fps = read_video(path)
    assert len(frames) == FRAMES and fps == FPS  # the video is untouched by the extra stream
    with av.open(str(path)) as container:
        [stream] = container.streams.audio
        assert stream.codec_context.name == "aac" and stream.codec_context.channels == 2
    decoded = read_audio_stream(path)
    assert decoded.sample_rate == RATE
    target = round(FRAMES / FPS * RATE)
    assert target <= decoded.samples.shape[1] < target + AAC_FRAME  # video's duration, within one AAC frame
    reference = np.pad(audio, ((0, 0), (0, max(0, target - samples))))[:, :target]
    assert _snr_db(reference, decoded.samples[:, :target]) >= AAC_MIN_SNR_DB
    assert _snr_db(reference, decoded.samples[::-1, :target]) < 10  # the channels are not swapped


def test_webm_carries_opus_for_the_videos_duration(tmp_path: Path):
    [path] = write_output(_frames(), FPS, tmp_path / "v.webm", audio=_tones(25000), sample_rate=RATE)
    decoded = read_audio_stream(path)  # libopus decodes at 48 kHz whatever rate went in
    seconds = decoded.samples.shape[1] / decoded.sample_rate
    assert abs(seconds - FRAMES / FPS) <= 0.020  # one Opus frame
    assert np.abs(decoded.samples).max() > 0.2


def test_a_rate_the_codec_cannot_take_is_refused_before_writing(tmp_path: Path):
    with pytest.raises(InvalidRequest, match=r"output: v.mp4: aac cannot encode 1000 Hz") as info:
        write_output(_frames(), FPS, tmp_path / "v.mp4", audio=_tones(1000, 1000), sample_rate=1000)
    assert info.value.field == "output"
    assert list(tmp_path.iterdir()) == []  # no file, no temp file
    [wav] = write_output(_frames(), FPS, tmp_path / "a.wav", audio=_tones(1000, 1000), sample_rate=1000)
    assert read_wav(wav).sample_rate == 1000  # WAV takes any rate


def test_wav_of_a_silent_output_is_refused(tmp_path: Path):
    with pytest.raises(InvalidRequest, match="has no audio") as info:
        write_output(_frames(), FPS, tmp_path / "a.wav")
    assert info.value.field == "output" and list(tmp_path.iterdir()) == []


def test_frame_formats_write_frames_only(tmp_path: Path):
    [gif] = write_output(_frames(), FPS, tmp_path / "v.gif", audio=_tones(25000), sample_rate=RATE)
    with av.open(str(gif)) as container:
        assert not container.streams.audio
    [mp4] = write_output(_frames(), FPS, tmp_path / "silent.mp4")
    with av.open(str(mp4)) as container:
        assert not container.streams.audio  # no audio given: no (silent) track either
    assert not [p for p in tmp_path.iterdir() if PARTIAL in p.name]


def test_mono_is_written_as_mono(tmp_path: Path):
    mono = _tones(25000)[:1]
    [path] = write_output(_frames(), FPS, tmp_path / "m.mp4", audio=mono, sample_rate=RATE)
    decoded = read_audio_stream(path)
    assert decoded.samples.shape[0] == 1
    assert _snr_db(mono, decoded.samples[:, :25000]) >= AAC_MIN_SNR_DB


@pytest.mark.parametrize("suffix", [".mp4", ".webm"])
def test_sound_encodes_are_reproducible(tmp_path: Path, suffix: str):
    written = [write_output(_frames(), FPS, tmp_path / f"{i}{suffix}", audio=_tones(25000), sample_rate=RATE)[0]
               for i in range(2)]
    assert written[0].read_bytes() == written[1].read_bytes()


def test_write_output_checks_audio_like_video_output(tmp_path: Path):
    with pytest.raises(ValueError, match="non-finite"):
        write_output(_frames(), FPS, tmp_path / "v.mp4", audio=np.full((2, 100), np.nan, np.float32), sample_rate=RATE)
    with pytest.raises(ValueError, match="float32, got float64"):
        write_output(_frames(), FPS, tmp_path / "v.mp4", audio=np.zeros((2, 100)), sample_rate=RATE)
    assert list(tmp_path.iterdir()) == []


def test_louder_than_full_scale_is_clipped_in_mp4(tmp_path: Path):
    loud = 3.0 * _tones(25000)
    [path] = write_output(_frames(), FPS, tmp_path / "v.mp4", audio=loud, sample_rate=RATE)
    decoded = read_audio_stream(path).samples[:, 2048:24000]
    assert np.abs(decoded).max() < 1.2  # clipped to [-1, 1] before AAC (its ringing stays small)
    assert _snr_db(np.clip(loud, -1, 1)[:, 2048:24000], decoded) >= 20  # clipped square-ish waves: harder to code


def test_an_audio_only_output_is_written_whole_as_wav_and_refused_as_video(tmp_path: Path):
    """An audio model's output has no frames (the diffusers adapter's audio pipelines): the WAV is its whole
    waveform, and a frame format names the problem instead of encoding an empty video."""
    audio = _tones(3000)
    no_frames = np.zeros((0, 1, 1, 3), dtype=np.uint8)
    [path] = write_output(no_frames, 1, tmp_path / "a.wav", audio=audio, sample_rate=RATE)
    assert read_wav(path).samples.shape == audio.shape
    with pytest.raises(InvalidRequest, match="unsupported extension '.mp4'; use one of .wav"):
        write_output(no_frames, 1, tmp_path / "a.mp4", audio=audio, sample_rate=RATE)
