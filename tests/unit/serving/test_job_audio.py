"""The job manager stores an output's sound in the job's mp4 (the file /v1/videos/{id}/content serves as is)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import av
import numpy as np

from vidloom.core.output import VideoOutput
from vidloom.media.audio import read_audio_stream
from vidloom.serving.job_backends import open_job_store
from vidloom.serving.jobs import JobManager

JOB = "video_" + "0" * 31 + "1"


def test_completed_job_mp4_keeps_the_audio(tmp_path: Path):
    store = open_job_store("sqlite", tmp_path)
    try:
        t = np.arange(10000) / 24000
        audio = np.stack([0.4 * np.sin(2 * np.pi * 440 * t), 0.2 * np.sin(2 * np.pi * 550 * t)]).astype(np.float32)
        output = VideoOutput(np.zeros((10, 32, 48, 3), np.uint8), 24, audio=audio, sample_rate=24000)
        JobManager._write_files(SimpleNamespace(store=store), JOB, output)  # type: ignore[arg-type]
        path = store.video_path(JOB)
        with av.open(str(path)) as container:
            assert len(container.streams.video) == 1 and container.streams.audio[0].codec_context.name == "aac"
        decoded = read_audio_stream(path)
        assert decoded.sample_rate == 24000 and 10000 <= decoded.samples.shape[1] < 10000 + 1024
        error = decoded.samples[:, :10000] - audio
        assert 10 * np.log10((audio ** 2).sum() / (error ** 2).sum()) >= 30  # codec tolerance: tests/unit/media
    finally:
        store.close()
