"""Equivalence rule, sound: an output's audio reaches `vidloom generate` (its .mp4 and --audio-out .wav), the
Python API (VideoOutput.audio / sample_rate) and the server (the job's stored mp4) as the same waveform.

No registered card makes sound yet on this branch (LTX-2 brings one), so the demo model's program is given an
"audio" slot by patching the one function that reads it (runtime.results.output_audio) and its card says
produces_audio; everything downstream of that slot — VideoOutput, the CLI's writers, the job manager's file
write, the content route — is the real code.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import numpy as np
import pytest

from tests.helpers.three_paths import CliServer, assert_same_outcome, request_forms, run_api, run_cli
from vidloom import registry
from vidloom.core.deploy import DeployConfig
from vidloom.media.audio import read_audio_stream, read_wav, to_pcm16
from vidloom.runtime import results

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # openai marks the Sora API deprecated

RATE = 24000
AAC_MIN_SNR_DB = 30.0  # the codec tolerance measured in tests/unit/media/test_audio.py
BASE, BASE_CLI, BASE_OPENAI, BASE_EXT = request_forms("a fox barks at the moon", seed=9)


def _program_audio(outputs: dict[str, Any]) -> tuple[np.ndarray, int]:
    """A stereo waveform from the request (seeded pitch), a little shorter than the video, as LTX-2's is."""
    request = outputs["request"]
    t = np.arange(round(request.num_frames / request.fps * RATE) - 300) / RATE
    pitch = 300.0 + 7 * request.seed
    return np.stack([0.5 * np.sin(2 * np.pi * pitch * t), 0.25 * np.sin(3 * np.pi * pitch * t)]).astype(np.float32), RATE


def _snr_db(reference: np.ndarray, decoded: np.ndarray) -> float:
    return float(10 * np.log10((reference ** 2).sum() / ((decoded - reference) ** 2).sum()))


def test_sound_reaches_every_entry_point_the_same_way(demo_cache: Path, tmp_path: Path, capsys, monkeypatch):
    monkeypatch.setenv("VIDLOOM_CACHE", str(demo_cache))
    monkeypatch.setattr(results, "output_audio", _program_audio)
    resolve = registry.resolve_card
    monkeypatch.setattr(registry, "resolve_card", lambda model: dataclasses.replace(resolve(model), produces_audio=True))

    wav = tmp_path / "cli.wav"
    cli = run_cli([*BASE_CLI, "--audio-out", str(wav)], tmp_path / "cli.mp4", capsys)
    api = run_api(demo_cache, DeployConfig(), **BASE)
    server = CliServer([], tmp_path / "serve-data")
    try:
        assert server.url is not None, f"vidloom serve exited with {server.code}"
        http = server.run(BASE_OPENAI, BASE_EXT)
        [job] = server.seen.written
        stored = tmp_path / "served.mp4"
        stored.write_bytes(httpx.get(f"{server.url}/v1/videos/{job}/content", timeout=30).content)
    finally:
        server.stop()

    assert api.output.audio is not None and api.output.sample_rate == RATE
    assert_same_outcome(api, cli, "CLI vs Python API")  # frames, and now audio and its rate
    assert_same_outcome(api, http, "HTTP vs Python API")
    meta = api.output.metadata
    expected, _ = _program_audio({"request": SimpleNamespace(num_frames=meta["num_frames"], fps=meta["fps"], seed=9)})
    assert np.array_equal(api.output.audio, expected)

    samples = round(api.output.duration_s * RATE)  # every file lasts as long as the video
    fitted = np.pad(api.output.audio, ((0, 0), (0, samples - api.output.audio.shape[1])))
    written = read_wav(wav)
    assert written.sample_rate == RATE and np.array_equal(to_pcm16(written.samples), to_pcm16(fitted))
    for mp4 in (tmp_path / "cli.mp4", stored):
        decoded = read_audio_stream(mp4)
        assert decoded.sample_rate == RATE and samples <= decoded.samples.shape[1] < samples + 1024
        assert _snr_db(fitted, decoded.samples[:, :samples]) >= AAC_MIN_SNR_DB, mp4


def test_audio_out_on_a_silent_output_is_refused(demo_cache: Path, tmp_path: Path, capsys, monkeypatch):
    """A card that says it makes sound but whose run made none: a clear --audio-out error, no files."""
    monkeypatch.setenv("VIDLOOM_CACHE", str(demo_cache))
    resolve = registry.resolve_card
    monkeypatch.setattr(registry, "resolve_card", lambda model: dataclasses.replace(resolve(model), produces_audio=True))
    outcome = run_cli([*BASE_CLI, "--audio-out", str(tmp_path / "a.wav")], tmp_path / "v.mp4", capsys)
    assert outcome.error is not None and outcome.error.startswith("error: --audio-out: a.wav: this output has no audio")
    assert list(tmp_path.iterdir()) == []

