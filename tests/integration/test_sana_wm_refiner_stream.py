"""SANA-WM --two-stage through the runtime and a real server: refined chunks stream as they finish (chunk
events whose frames, in order, are the video; SSE `chunk` events), the refiner's window is held by the
cache manager and freed on completion and on cancel, and a deployment that cannot refine is refused by name."""

from __future__ import annotations

import io
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from PIL import Image

from tests.helpers.sana_wm_checkpoints import SANA_WM_A, write_tiny_refiner, write_tiny_sana_wm
from tests.helpers.servers import ThreadServer, events_then_live_stream
from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import Cancelled, DeployError
from vidloom.core.output import ChunkEvent, ProgressEvent
from vidloom.generator import VideoGenerator
from vidloom.families.sana_wm.refine_loop import SanaWMRefineLoop
from vidloom.runtime.engine import CancellationToken
from vidloom.serving.config import ServeConfig

# 41 frames -> 6 latent frames: sink 0, chunks [1, 4) and [4, 6) -> video frames [0, 24) and [24, 40).
FRAME_RANGES = [(0, 24), (24, 40)]
BASE = dict(height=64, width=96, num_frames=41, num_inference_steps=2, seed=5, guidance_scale=1.0,
            intrinsics=[50.0, 52.0, 35.0, 20.0], camera="w-16,jw-16,ik-8")
IMAGE = Image.fromarray(np.random.default_rng(1).integers(0, 256, (40, 70, 3), dtype=np.uint8))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    folder = write_tiny_sana_wm(tmp_path_factory.mktemp("sana-two-stage"), SANA_WM_A)
    write_tiny_refiner(folder, SANA_WM_A)
    return folder


@pytest.fixture(scope="module")
def gen(folder):
    return VideoGenerator.from_pretrained(folder, device="cpu", deploy=DeployConfig(two_stage=True))


def test_chunks_stream_in_order_and_the_window_is_freed(gen):
    caches = gen.engine.caches
    events: list[Any] = []
    held: list[int] = []

    def on_event(event: Any) -> None:
        events.append(event)
        if isinstance(event, ProgressEvent) and event.phase == "refine":
            held.append(caches.bytes_in_use)

    out = gen.generate("a car driving", image=IMAGE, on_event=on_event, **BASE)
    chunks = [e.chunk for e in events if isinstance(e, ChunkEvent)]
    assert [(c.start_frame, c.stop_frame) for c in chunks] == FRAME_RANGES
    assert all(c.total == 2 for c in chunks)
    assert np.array_equal(np.concatenate([c.frames for c in chunks]), out.frames)
    # The window of 6 latent frames of 2x3 tokens: a 1-frame sink and up to 5 frames of history.
    loop_bytes = SanaWMRefineLoop(gen.engine.instance["refiner"], torch.float32).window_bytes(1, 6, 2, 3)
    assert held and set(held) == {loop_bytes} and loop_bytes > 0
    assert caches.bytes_in_use == 0 and caches.stats()["handles"] == 0


def test_cancel_mid_refine_frees_the_window(gen):
    caches, token = gen.engine.caches, CancellationToken()

    def stop_in_refiner(event: Any) -> None:
        if isinstance(event, ProgressEvent) and event.phase == "refine":
            token.cancel()

    with pytest.raises(Cancelled):
        gen.generate("a car driving", image=IMAGE, on_event=stop_in_refiner, cancel=token, **BASE)
    assert caches.bytes_in_use == 0 and caches.stats()["handles"] == 0


def test_server_sends_chunk_events_then_the_whole_video(gen, tmp_path, first_frame_png):
    config = ServeConfig(data_dir=tmp_path / "data", queue_size=2, graceful_shutdown_s=2)
    form = {"prompt": "a car driving", "size": "96x64", "num_frames": "41", "num_inference_steps": "2",
            "guidance_scale": "1", "seed": "5", "camera": BASE["camera"], "intrinsics": "[50, 52, 35, 20]"}
    with ThreadServer(gen.engine, config) as server, httpx.Client(base_url=server.url, timeout=120) as client:
        job = client.post("/v1/videos", data=form,
                          files={"input_reference": ("first.png", first_frame_png, "image/png")})
        assert job.status_code == 200, job.text
        events, streamed_frames = events_then_live_stream(client, job.json()["id"])
    assert streamed_frames == 40
    names = [name for name, _ in events]
    assert names[-1] == "completed"
    chunks = [d for n, d in events if n == "chunk"]
    assert [(c["start_frame"], c["stop_frame"]) for c in chunks] == FRAME_RANGES
    assert names.index("chunk") < names.index("completed")


@pytest.fixture(scope="module")
def first_frame_png() -> bytes:
    buffer = io.BytesIO()
    IMAGE.save(buffer, format="PNG")
    return buffer.getvalue()


def test_two_stage_needs_the_refiner_folder_and_refuses_the_upsampler(tmp_path, folder):
    bare = write_tiny_sana_wm(tmp_path / "bare", SANA_WM_A)
    with pytest.raises(DeployError, match="two_stage.*refiner"):
        VideoGenerator.from_pretrained(bare, device="cpu", deploy=DeployConfig(two_stage=True))
    with pytest.raises(DeployError, match="upsampler"):
        VideoGenerator.from_pretrained(folder, device="cpu", deploy=DeployConfig(upsampler=str(folder)))


def test_memory_estimate_counts_the_refiner_window(gen, folder):
    from vidloom.core.request import GenerationRequest
    from vidloom.media.request_inputs import resolve_request
    from vidloom.families.sana_wm.memory import footprint

    request = resolve_request(GenerationRequest(prompt="a car", image=[IMAGE], **BASE), gen.card)
    one_stage = VideoGenerator.from_pretrained(folder, device="cpu").engine.instance
    two, one = footprint(gen.engine.instance, request), footprint(one_stage, request)
    window = SanaWMRefineLoop(gen.engine.instance["refiner"], torch.float32).window_bytes(1, 6, 2, 3)
    assert two.persistent - one.persistent >= window > 0
