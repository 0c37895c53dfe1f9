"""`vidloom serve --model hunyuan15-demo` through the OpenAI Videos API with the official client: text to video, and
image to video with an uploaded `input_reference`; the served frames are the generator's own for the same request."""

from __future__ import annotations

import io

import httpx
import numpy as np
import pytest
from PIL import Image

from tests.helpers.servers import wait_for_status
from tests.helpers.three_paths import CliServer
from vidloom.generator import VideoGenerator

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")
EXTRA = {"num_frames": 5, "num_inference_steps": 2, "seed": 4}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    cache = tmp_path_factory.mktemp("hv15-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VIDLOOM_CACHE", str(cache))
        server = CliServer(["--model", "hunyuan15-demo"], tmp_path_factory.mktemp("hv15-data"))
        assert server.url is not None, f"vidloom serve did not start (exit {server.code})"
        try:
            yield server, VideoGenerator.from_pretrained("hunyuan15-demo", device="cpu", cache_dir=cache)
        finally:
            server.stop()


def _create(server: CliServer, **fields) -> tuple[str, dict]:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="test", max_retries=0)
    video = client.videos.create(prompt="a red fox", **fields, extra_body=EXTRA)
    with httpx.Client(base_url=server.url, timeout=30) as http:
        return video.id, wait_for_status(http, video.id, {"completed", "failed", "cancelled"})


def test_text_to_video_is_the_generators_video(served):
    server, gen = served
    video_id, job = _create(server, size="80x48")
    assert job["status"] == "completed" and job["parameters"]["task"] == "t2v", job
    expected = gen.generate("a red fox", height=48, width=80, **EXTRA).frames
    assert np.array_equal(server.seen.written[video_id].frames, expected)


def test_an_uploaded_input_reference_is_the_first_frame(served):
    server, gen = served
    image = Image.fromarray(np.random.default_rng(2).integers(0, 256, (60, 30, 3), dtype=np.uint8))
    png = io.BytesIO()
    image.save(png, "PNG")
    video_id, job = _create(server, input_reference=("first.png", png.getvalue(), "image/png"))
    assert job["status"] == "completed" and job["parameters"]["task"] == "i2v", job
    expected = gen.generate("a red fox", image=image, **EXTRA).frames
    assert expected.shape == (5, 80, 40, 3)  # the portrait image's bucket
    assert np.array_equal(server.seen.written[video_id].frames, expected)
