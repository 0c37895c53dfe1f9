"""Qwen3-Omni chat with audio, image and video parts on a tiny checkpoint, through the official openai client: the
answers equal the Python API's (which equal transformers', tests/parity/test_qwen3_omni_inputs.py), bad parts are 400s
naming them, and a checkpoint without the towers' processor settings refuses media parts by name."""

from __future__ import annotations

import base64
import shutil

import httpx
import numpy as np
import pytest
import torch

from tests.helpers.chat_videos import video_bytes, video_part
from tests.helpers.qwen3_omni_checkpoints import AUDIO_CHUNK_S, THINKER_A, write_tiny_thinker
from tests.helpers.servers import ThreadServer
from tests.parity.test_qwen_omni_inputs import clip, png_url, wav_bytes
from vidloom.core.errors import InvalidRequest
from vidloom.generator import VideoGenerator
from vidloom.models.omni_towers import PROCESSOR_FILE
from vidloom.serving.config import ServeConfig


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(the running server, its generator, the folder) on moe-a, whose towers take 16-pixel patches."""
    torch.set_num_threads(1)
    folder = write_tiny_thinker(tmp_path_factory.mktemp("q3-media") / "qwen3-omni-tiny", THINKER_A)
    gen = VideoGenerator.from_pretrained(str(folder), device="cpu")
    with ThreadServer(gen.engine, ServeConfig(data_dir=folder.parent / "data", queue_size=8,
                                              graceful_shutdown_s=2)) as running:
        yield running, gen, folder


def _messages(seed: int) -> list[dict]:
    audio, _ = clip(seed, 1.3)
    url, _ = png_url(seed, (90, 70))
    return [{"role": "user", "content": [audio, {"type": "text", "text": "what is a kite?"},
                                         {"type": "image_url", "image_url": {"url": url}}]}]


def test_audio_and_image_parts_answer_as_the_python_api(served):
    import openai

    server, gen, _ = served
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    model = server.app.state.jobs.card.model_id
    messages = _messages(3)
    r = client.chat.completions.create(model=model, messages=messages, max_tokens=8, temperature=0)
    local = gen.chat(messages, max_tokens=8, temperature=0.0)
    assert r.choices[0].message.content == local.text and r.usage.prompt_tokens == local.prompt_tokens
    assert r.usage.completion_tokens == 8 and local.prompt_tokens > 30  # the placeholders were widened
    stream = client.chat.completions.create(model=model, messages=messages, max_tokens=8, temperature=0, stream=True)
    assert "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices) == local.text
    assert server.app.state.jobs.engine.chat_stats()["kv_blocks_in_use"] == 0


def test_a_video_with_its_sound_answers_as_the_python_api(served):
    import openai

    server, gen, _ = served
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    model = server.app.state.jobs.card.model_id
    messages = [{"role": "user", "content": [{"type": "text", "text": "what is a kite?"},
                                             video_part(video_bytes(4, sound=True), use_audio=True)]}]
    r = client.chat.completions.create(model=model, messages=messages, max_tokens=8, temperature=0)
    local = gen.chat(messages, max_tokens=8, temperature=0.0)
    silent = [{"role": "user", "content": [messages[0]["content"][0], video_part(video_bytes(4, sound=True))]}]
    silent = gen.chat(silent, max_tokens=8, temperature=0.0)
    assert r.choices[0].message.content == local.text and r.usage.prompt_tokens == local.prompt_tokens
    assert local.prompt_tokens > silent.prompt_tokens + 20  # 2 s of sound: 26 tokens and their start/end
    caps = httpx.get(f"{server.url}/v1/models/{model}", timeout=30).json()["capabilities"]
    assert "video" in caps["chat_inputs"]
    assert server.app.state.jobs.engine.chat_stats()["kv_blocks_in_use"] == 0


def _video_url(data: bytes, **extra) -> dict:
    part = video_part(data)
    part["video_url"].update(extra)
    return part


def _too_long() -> dict:
    data = wav_bytes(np.zeros(16000 * (AUDIO_CHUNK_S + 1), np.float32))
    return {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode(), "format": "wav"}}


@pytest.mark.parametrize(("part", "param"), [
    ({"type": "input_audio", "input_audio": {"data": base64.b64encode(b"nope" * 64).decode(), "format": "mp3"}},
     "messages[0].content[1].input_audio"),
    ({"type": "input_audio", "input_audio": {"data": base64.b64encode(b"RIFF\0\0\0\0WAVE" + b"\0" * 64).decode(),
                                            "format": "wav"}}, "messages[0].content[1].input_audio"),
    ({"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(b"nope" * 64).decode()}},
     "messages[0].content[1].image_url"),
    ({"type": "image_url", "image_url": {"url": png_url(5, (600, 2))[0]}}, "messages[0].content[1]"),
    (_too_long(), "messages[0].content[1]"),
    (_video_url(b"nope" * 64), "messages[0].content[1].video_url"),
    (_video_url(video_bytes(1), use_audio_in_video=True), "messages[0].content[1].video_url"),  # no sound track
    (_video_url(video_bytes(1), use_audio_in_video="yes"), "messages[0].content[1].video_url.use_audio_in_video"),
    (_video_url(video_bytes(1), fps=4), "messages[0].content[1].video_url"),
    ({"type": "video_url", "video_url": {"url": "https://example.com/a.mp4"}}, "messages[0].content[1].video_url"),
    (_video_url(video_bytes(1, frames=1)), "messages[0].content[1]"),  # fewer frames than the temporal patch
    (_video_url(video_bytes(1, frames=4 * (AUDIO_CHUNK_S + 1), sound=True), use_audio_in_video=True),
     "messages[0].content[1]"),  # its sound track is longer than the feature extractor's window
])
def test_bad_parts_are_a_400_naming_the_part(served, part, param):
    server = served[0]
    body = {"model": server.app.state.jobs.card.model_id, "max_tokens": 2,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, part]}]}
    with httpx.Client(base_url=server.url, timeout=60) as client:
        r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"].startswith(param), r.text


def test_without_processor_settings_media_parts_are_refused_by_name(served, tmp_path):
    bare = shutil.copytree(served[2], tmp_path / "no-processors")
    (bare / PROCESSOR_FILE).unlink()
    gen = VideoGenerator.from_pretrained(str(bare), device="cpu")
    with pytest.raises(InvalidRequest) as err:
        gen.chat(_messages(1), max_tokens=2, temperature=0.0)
    assert err.value.field == "messages[0].content[0]" and PROCESSOR_FILE in str(err.value)
    assert gen.chat([{"role": "user", "content": "hi"}], max_tokens=2, temperature=0.0).completion_tokens == 2
