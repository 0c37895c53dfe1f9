"""Chunk streaming from a causal model (tiny AnyFlow-FAR) through a real server: SSE `chunk` events,
the growing fragmented MP4 (`variant=stream`), time to first chunk, delete and cancel mid-stream."""

from __future__ import annotations

import io
import threading
import time
from pathlib import Path
from typing import Iterator

import av
import httpx
import numpy as np
import pytest

from tests.helpers.far_checkpoints import FAR_A, write_tiny_far
from tests.helpers.polling import wait_until
from tests.helpers.servers import ThreadServer, parse_sse, wait_for_status
from vidloom.families.wan_causal import loop as far_loop
from vidloom.serving.config import ServeConfig

# 17 frames = 5 latent frames: chunks of 1, 2 and 2 latent frames, i.e. video frames [0, 1), [1, 9), [9, 17).
JOB = {"prompt": "a cat", "size": "32x32", "num_frames": 17, "num_inference_steps": 2, "seed": 3}
FRAME_RANGES = [(0, 1), (1, 9), (9, 17)]


@pytest.fixture(scope="module")
def far_engine(tmp_path_factory):
    from vidloom.generator import VideoGenerator

    folder = write_tiny_far(tmp_path_factory.mktemp("far-stream"), FAR_A)
    return VideoGenerator.from_pretrained(folder, device="cpu").engine


@pytest.fixture
def far_server(far_engine, tmp_path) -> Iterator[ThreadServer]:
    config = ServeConfig(data_dir=tmp_path / "data", graceful_shutdown_s=2, cancel_wait_s=0.5)
    with ThreadServer(far_engine, config) as running:
        yield running


@pytest.fixture
def client(far_server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=far_server.url, timeout=30) as c:
        yield c


class DecodeGate:
    """Holds the rollout before decoding chunk `index` until `release()`: the job is running, chunks before it are out."""

    def __init__(self, index: int) -> None:
        self.index, self.calls = index, 0
        self.reached, self.released = threading.Event(), threading.Event()
        self._decode = far_loop.decode_chunk

    def __call__(self, **inputs):
        if self.calls == self.index:
            self.reached.set()
            assert self.released.wait(60), "gate never released"
        self.calls += 1
        return self._decode(**inputs)

    def release(self) -> None:
        self.released.set()


@pytest.fixture
def gate(monkeypatch) -> Iterator[DecodeGate]:
    held = DecodeGate(index=2)
    monkeypatch.setattr(far_loop, "decode_chunk", held)
    yield held
    held.release()


class StreamReader(threading.Thread):
    """Reads a `variant=stream` response in the background, keeping every byte received so far."""

    def __init__(self, client: httpx.Client, video_id: str) -> None:
        super().__init__(daemon=True)
        self.client, self.video_id = client, video_id
        self.data = bytearray()
        self.status: int | None = None
        self.ended = threading.Event()
        self.start()

    def run(self) -> None:
        try:
            with self.client.stream("GET", f"/v1/videos/{self.video_id}/content",
                                    params={"variant": "stream"}, timeout=60) as response:
                self.status = response.status_code
                for piece in response.iter_bytes():
                    self.data += piece
        finally:
            self.ended.set()

    def frames(self) -> int:
        return len(decode(bytes(self.data)))

    def wait_for_frames(self, count: int, timeout: float = 30) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if (got := self.frames()) >= count:
                    return got
            except av.error.FFmpegError:
                pass  # nothing decodable yet
            time.sleep(0.05)
        raise TimeoutError(f"the stream never held {count} frames ({len(self.data)} bytes)")


def decode(data: bytes) -> np.ndarray:
    with av.open(io.BytesIO(data)) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


def create(client: httpx.Client) -> str:
    response = client.post("/v1/videos", json=JOB)
    assert response.status_code == 200, response.text
    return response.json()["id"]


def events_of(client: httpx.Client, video_id: str) -> list[tuple[str, dict]]:
    with client.stream("GET", f"/v1/videos/{video_id}/events", timeout=60) as response:
        return parse_sse(list(response.iter_lines()))


def stream_files(data_dir: Path) -> list[str]:
    return sorted(p.name for p in (data_dir / "videos").iterdir() if p.suffix == ".fmp4")


def test_chunk_events_come_before_completed_with_their_frame_ranges(client, gate):
    gate.index = 0  # hold the job before its first chunk, so the subscriber sees every chunk live
    video_id = create(client)
    assert gate.reached.wait(30)
    collected: list[tuple[str, dict]] = []
    reader = threading.Thread(target=lambda: collected.extend(events_of(client, video_id)))
    reader.start()
    time.sleep(0.2)
    gate.release()
    reader.join(60)

    names = [name for name, _ in collected]
    assert names[0] == "progress" and names[-1] == "completed" and names.count("completed") == 1
    chunks = [d for n, d in collected if n == "chunk"]
    assert [(c["index"], c["start_frame"], c["stop_frame"]) for c in chunks] == [
        (i, a, b) for i, (a, b) in enumerate(FRAME_RANGES)]
    assert all(c["total"] == 3 and c["fps"] == 16 and c["missed_chunks"] == 0 for c in chunks)
    assert [c["stop_s"] for c in chunks] == pytest.approx([1 / 16, 9 / 16, 17 / 16])
    assert chunks[1]["start_s"] == pytest.approx(1 / 16)
    # Per-chunk progress is there too: the "chunks" phase counts finished chunks.
    assert [d["step"] for n, d in collected if n == "progress" and d["phase"] == "chunks"] == [1, 2, 3]
    percents = [d["percent"] for n, d in collected if n == "progress"]
    assert percents == sorted(percents) and percents[-1] >= 90  # the rollout's steps count, not an absent "denoise"


def test_stream_is_playable_while_running_and_whole_when_done(client, gate, far_server):
    video_id = create(client)
    assert gate.reached.wait(30)
    reader = StreamReader(client, video_id)
    assert reader.wait_for_frames(9) == 9  # chunks 0 and 1, decoded by PyAV...
    assert client.get(f"/v1/videos/{video_id}").json()["status"] == "in_progress"  # ...while the job runs
    assert client.get(f"/v1/videos/{video_id}/content").status_code == 409  # plain content: only once completed
    gate.release()
    assert reader.ended.wait(60) and reader.status == 200

    done = wait_for_status(client, video_id, {"completed"})
    finished = decode(client.get(f"/v1/videos/{video_id}/content").content)
    streamed = decode(bytes(reader.data))
    assert streamed.shape == finished.shape == (17, 32, 32, 3)
    # Two H.264 encodes of the same frames (zero-latency for the stream), so close, not equal: the same
    # video in the same order when each streamed frame is nearest to the finished frame at its index.
    distance = np.abs(streamed[:, None].astype(int) - finished[None].astype(int)).mean(axis=(2, 3, 4))
    assert list(distance.argmin(axis=1)) == list(range(17)) and distance.diagonal().max() < 16
    # A completed job's stream is a plain download of the same bytes.
    again = client.get(f"/v1/videos/{video_id}/content", params={"variant": "stream"})
    assert again.status_code == 200 and again.content == bytes(reader.data)
    assert stream_files(far_server.config.data_dir) == [f"{video_id}.fmp4"]

    ttfc = done["time_to_first_chunk_s"]
    assert 0 < ttfc < done["metadata"]["elapsed_s"] + 5 and done["metadata"]["time_to_first_chunk_s"] == ttfc
    metrics = client.get("/metrics").text
    assert "vidloom_time_to_first_chunk_seconds_count 1.0" in metrics

    assert client.delete(f"/v1/videos/{video_id}").status_code == 200
    assert stream_files(far_server.config.data_dir) == []


def test_time_to_first_chunk_is_stored_and_shown_while_running(client, gate, far_server):
    video_id = create(client)
    assert gate.reached.wait(30)
    deadline = time.monotonic() + 10
    while (video := client.get(f"/v1/videos/{video_id}").json())["time_to_first_chunk_s"] is None:
        assert time.monotonic() < deadline, video
        time.sleep(0.02)
    assert video["status"] == "in_progress"
    stored = far_server.app.state.jobs.store.get(video_id)
    assert stored.time_to_first_chunk_s == video["time_to_first_chunk_s"] > 0


def test_delete_while_streaming_ends_the_stream_and_removes_its_file(client, gate, far_server):
    video_id = create(client)
    assert gate.reached.wait(30)
    reader = StreamReader(client, video_id)
    reader.wait_for_frames(9)
    assert any(name.endswith(".growing.fmp4") for name in (p.name for p in (far_server.config.data_dir / "videos").iterdir()))
    assert client.delete(f"/v1/videos/{video_id}").status_code == 200
    assert reader.ended.wait(30), "the stream did not end after delete"
    assert reader.frames() == 9  # what was committed, as whole fragments
    gate.release()
    assert client.get(f"/v1/videos/{video_id}").status_code == 404
    wait_until(lambda: not any((far_server.config.data_dir / "videos").iterdir()))


def test_cancelled_job_stream_ends_and_is_gone(client, gate, far_server):
    video_id = create(client)
    assert gate.reached.wait(30)
    reader = StreamReader(client, video_id)
    reader.wait_for_frames(9)
    cancel = threading.Thread(target=lambda: client.post(f"/v1/videos/{video_id}/cancel"))
    cancel.start()
    time.sleep(0.1)
    gate.release()  # the cancel takes effect at the next step boundary
    cancel.join(30)
    assert wait_for_status(client, video_id, {"cancelled"})["status"] == "cancelled"
    assert reader.ended.wait(30), "the stream did not end after cancel"
    assert reader.frames() in (9, 17)  # the last chunk may have been decoded before the boundary
    later = client.get(f"/v1/videos/{video_id}/content", params={"variant": "stream"})
    assert later.status_code == 409 and "cancelled" in later.json()["error"]["message"]
    wait_until(lambda: stream_files(far_server.config.data_dir) == []
                and not any(p.name.startswith(".") for p in (far_server.config.data_dir / "videos").iterdir()))


def test_a_model_without_chunks_streams_its_finished_mp4(start_server):
    """Wan makes the whole video at once: its stream waits for it, then is the finished mp4 (empty if it never is)."""
    from tests.helpers.servers import BlockingJob, create_video

    server = start_server()
    with httpx.Client(base_url=server.url, timeout=60) as c:
        blocker = BlockingJob(c)
        waiting = StreamReader(c, blocker.id)
        wait_until(lambda: waiting.status is not None)
        assert waiting.status == 200 and not waiting.ended.wait(0.3)  # open, nothing to send yet
        job = create_video(c)  # queued behind the blocker
        streamed = StreamReader(c, job["id"])
        assert c.delete(f"/v1/videos/{blocker.id}").status_code == 200
        assert waiting.ended.wait(30) and bytes(waiting.data) == b""  # deleted before it had any frames
        assert streamed.ended.wait(60) and streamed.status == 200
        assert wait_for_status(c, job["id"], {"completed"})["time_to_first_chunk_s"] is None
        finished = c.get(f"/v1/videos/{job['id']}/content").content
        assert bytes(streamed.data) == finished
        assert c.get(f"/v1/videos/{job['id']}/content", params={"variant": "stream"}).content == finished
