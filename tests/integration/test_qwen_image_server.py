"""Qwen-Image editing through the Images API (`/v1/images/edits`) with the official openai client: the served PNG
is the engine's own edit of the uploaded image (negative prompt and scale carried through), and a second image is
refused naming the field (an edit checkpoint takes one reference); an edit-plus checkpoint takes several `image[]`
files, in order."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
from PIL import Image

from tests.helpers.qwen_image_checkpoints import write_qwen_image_edit
from tests.helpers.servers import ThreadServer
from vidloom.core.request import GenerationRequest, Task
from vidloom.media.frames import to_uint8
from vidloom.serving.config import ServeConfig

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")


def _png(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, "PNG")
    return buf.getvalue()


def _serve(tmp_path_factory, pipeline: str):
    from vidloom.generator import VideoGenerator

    folder = write_qwen_image_edit(tmp_path_factory.mktemp("edit"), pipeline=pipeline)
    engine = VideoGenerator.from_pretrained(folder, device="cpu").engine
    config = ServeConfig(data_dir=tmp_path_factory.mktemp("edit-data"), queue_size=4, graceful_shutdown_s=2,
                         max_body_bytes=4 << 20)
    with ThreadServer(engine, config) as running:
        yield engine, openai.OpenAI(base_url=f"{running.url}/v1", api_key="test", max_retries=0)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    yield from _serve(tmp_path_factory, "QwenImageEditPipeline")


@pytest.fixture(scope="module")
def served_plus(tmp_path_factory):
    yield from _serve(tmp_path_factory, "QwenImageEditPlusPipeline")


def test_openai_client_edit_is_the_engines_edit(served):
    engine, client = served
    image = Image.fromarray(np.random.default_rng(4).integers(0, 256, (48, 64, 3), dtype=np.uint8))
    result = client.images.edit(image=("a.png", _png(image), "image/png"), prompt="make it purple", size="48x32",
                                extra_body={"num_inference_steps": 2, "seed": 3, "negative_prompt": "blurry",
                                            "guidance_scale": 3.0})
    got = np.asarray(Image.open(io.BytesIO(base64.b64decode(result.data[0].b64_json))).convert("RGB"))
    direct = engine.run(GenerationRequest(prompt="make it purple", task=Task.T2I, image=(image,), height=32, width=48,
                                          num_inference_steps=2, seed=3, negative_prompt="blurry",
                                          guidance_scale=3.0))["video"]
    assert np.array_equal(got, to_uint8(direct)[0])


def test_a_second_reference_image_is_refused_naming_image(served):
    _, client = served
    png = _png(Image.new("RGB", (64, 48)))
    with pytest.raises(openai.BadRequestError) as err:
        client.images.edit(image=[("a.png", png, "image/png"), ("b.png", png, "image/png")], prompt="x",
                           size="48x32", extra_body={"num_inference_steps": 1})
    assert "image" in str(err.value)


def test_openai_client_multi_image_edit_is_the_engines_edit(served_plus):
    engine, client = served_plus
    rng = np.random.default_rng(5)
    images = [Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8)) for shape in ((48, 64, 3), (40, 40, 3))]
    result = client.images.edit(image=[(f"{i}.png", _png(im), "image/png") for i, im in enumerate(images)],
                                prompt="the two together", size="32x64", extra_body={"num_inference_steps": 2,
                                                                                     "seed": 6})
    got = np.asarray(Image.open(io.BytesIO(base64.b64decode(result.data[0].b64_json))).convert("RGB"))
    direct = engine.run(GenerationRequest(prompt="the two together", task=Task.T2I, image=tuple(images), height=64,
                                          width=32, num_inference_steps=2, seed=6))["video"]
    swapped = engine.run(GenerationRequest(prompt="the two together", task=Task.T2I, image=tuple(images[::-1]),
                                           height=64, width=32, num_inference_steps=2, seed=6))["video"]
    assert np.array_equal(got, to_uint8(direct)[0])
    assert not np.array_equal(got, to_uint8(swapped)[0])  # the files' order is the pictures' order
