"""Helios through the server: each 33-frame chunk reaches the client as an SSE chunk event before the request ends,
the live fMP4 stream holds the chunks, and a request cancelled mid-chunk ends holding nothing."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from tests.helpers.servers import ThreadServer, events_then_live_stream
from vidloom.core.errors import Cancelled
from vidloom.core.live_prompt import LIVE_PROMPTS
from vidloom.core.output import ChunkEvent, CompletedEvent, ProgressEvent
from vidloom.generator import VideoGenerator
from vidloom.runtime.engine import CancellationToken
from vidloom.serving.config import ServeConfig

RUN = dict(num_frames=65, num_inference_steps=2, seed=5)  # two chunks of the demo's 64x96


@pytest.fixture(scope="module")
def gen(tmp_path_factory) -> VideoGenerator:
    return VideoGenerator.from_pretrained("helios-demo", device="cpu", cache_dir=tmp_path_factory.mktemp("cache"))


def test_the_first_chunk_arrives_well_before_the_end(gen):
    arrivals: list[tuple[str, float]] = []

    def record(event: Any) -> None:
        kind = "chunk" if isinstance(event, ChunkEvent) else "done" if isinstance(event, CompletedEvent) else \
            "step" if isinstance(event, ProgressEvent) and event.phase == "denoise" else ""
        if kind:
            arrivals.append((kind, time.perf_counter()))

    gen.generate("a paper boat", on_event=record, **RUN)
    end = time.perf_counter()
    chunks = [t for kind, t in arrivals if kind == "chunk"]
    assert len(chunks) == 2
    # Two equal chunks, timed from the first denoise step (the text encoding, whose share of a demo run varies
    # with the machine, comes before both): the first is out at about 40% of that span (half its steps, its decode).
    start = next(t for kind, t in arrivals if kind == "step")
    assert (chunks[0] - start) / (end - start) < 0.75, (chunks[0] - start, end - start)


def test_cancel_mid_chunk_stops_and_holds_nothing(gen):
    token, seen = CancellationToken(), []

    def stop_in_second_chunk(event: Any) -> None:
        seen.append(event)
        if isinstance(event, ProgressEvent) and event.phase == "denoise" and event.step == 3:
            token.cancel()  # the first step of the second chunk

    with pytest.raises(Cancelled):
        gen.generate("a paper boat", on_event=stop_in_second_chunk, cancel=token, **RUN)
    assert [e.chunk.index for e in seen if isinstance(e, ChunkEvent)] == [0]
    assert gen.engine.caches.bytes_in_use == 0 and gen.engine.caches.stats()["handles"] == 0
    assert gen.engine.instance[LIVE_PROMPTS].running() == 0  # its live prompt entry closed too


def test_server_sends_chunk_events_then_the_whole_video(gen, tmp_path):
    config = ServeConfig(data_dir=tmp_path / "data", queue_size=2, graceful_shutdown_s=2)
    form = {"prompt": "a paper boat", "size": "96x64", "num_frames": 65, "num_inference_steps": 2, "seed": 5}
    with ThreadServer(gen.engine, config) as server, httpx.Client(base_url=server.url, timeout=300) as client:
        job = client.post("/v1/videos", json=form)
        assert job.status_code == 200, job.text
        events, streamed_frames = events_then_live_stream(client, job.json()["id"])
    assert streamed_frames == 65
    names = [name for name, _ in events]
    chunks = [d for n, d in events if n == "chunk"]
    assert [(c["start_frame"], c["stop_frame"]) for c in chunks] == [(0, 33), (33, 65)]
    assert names[-1] == "completed" and names.index("chunk") < names.index("completed")
