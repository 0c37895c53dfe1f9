"""Chat completions with audio and image parts on a tiny Qwen2.5-Omni checkpoint, through the official openai client:
the answers equal the Python API's, and bad parts are 400s naming them."""

from __future__ import annotations

import base64
import io
import re
import tempfile
import threading
import wave

import httpx
import numpy as np
import pytest
import torch

from tests.helpers.qwen_omni_checkpoints import AUDIO_CHUNK_S, OMNI_A, write_tiny_omni
from tests.helpers.servers import ThreadServer
from tests.parity.test_qwen_omni_inputs import clip, conversation, png_url, wav_bytes
from vidloom.families.qwen_omni.cards import SPOKEN_SYSTEM_PROMPT
from vidloom.serving.config import ServeConfig


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from vidloom.generator import VideoGenerator

    torch.set_num_threads(1)
    folder = write_tiny_omni(tmp_path_factory.mktemp("omni") / "omni-tiny", OMNI_A)
    gen = VideoGenerator.from_pretrained(str(folder), device="cpu")
    config = ServeConfig(data_dir=tmp_path_factory.mktemp("speech-inputs-data"), queue_size=8, graceful_shutdown_s=2)
    with ThreadServer(gen.engine, config) as running:
        yield running, gen


@pytest.fixture
def oc(served):
    import openai

    return openai.OpenAI(base_url=f"{served[0].url}/v1", api_key="unused", max_retries=0)


def _model(server) -> str:
    return server.app.state.jobs.card.model_id


def test_audio_and_image_parts_answer_as_the_python_api(served, oc):
    server, gen = served
    messages, _, _ = conversation(3)
    r = oc.chat.completions.create(model=_model(server), messages=messages, max_tokens=6, temperature=0)
    local = gen.chat(messages, max_tokens=6, temperature=0.0)
    assert r.choices[0].message.content == local.text and r.usage.prompt_tokens == local.prompt_tokens
    spoken = oc.chat.completions.create(model=_model(server), messages=messages, max_tokens=6, temperature=0,
                                        modalities=["text", "audio"], audio={"voice": "Ethan", "format": "wav"})
    # spoken, the conversation is led by the model card's documented system prompt (it has no system message)
    local_spoken = gen.chat([{"role": "system", "content": SPOKEN_SYSTEM_PROMPT}, *messages], max_tokens=6,
                            temperature=0.0)
    assert spoken.choices[0].message.audio.transcript == local_spoken.text
    with wave.open(io.BytesIO(base64.b64decode(spoken.choices[0].message.audio.data))) as w:
        assert w.getframerate() == 24000
    assert server.app.state.jobs.engine.chat_stats()["kv_blocks_in_use"] == 0


def _too_long() -> dict:
    data = wav_bytes(np.zeros(16000 * (AUDIO_CHUNK_S + 1), np.float32))
    return {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode(), "format": "wav"}}


@pytest.mark.parametrize(("part", "param"), [
    ({"type": "input_audio", "input_audio": {"data": base64.b64encode(b"nope").decode(), "format": "mp3"}},
     "messages[0].content[1].input_audio"),
    ({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "ogg"}}, "messages[0].content[1].input_audio.format"),
    ({"type": "image_url", "image_url": {"url": "https://example.com/kite.png"}}, "messages[0].content[1].image_url"),
    (_too_long(), "messages[0].content[1]"),
    ({"type": "input_audio", "input_audio": {**clip(4, 0.5)[0]["input_audio"], "sample_rate": 8000}},
     "messages[0].content[1].input_audio"),  # an extra key was ignored
])
def test_bad_parts_are_a_400_naming_the_part(served, part, param):
    server, _ = served
    body = {"model": _model(server), "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, part]}]}
    with httpx.Client(base_url=server.url, timeout=60) as client:
        r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


WIDE = {"type": "image_url", "image_url": {"url": png_url(5, (600, 2))[0]}}
UNREADABLE = [
    {"type": "input_audio", "input_audio": {"data": base64.b64encode(b"RIFF\0\0\0\0WAVE" + b"\0" * 64).decode(),
                                            "format": "wav"}},
    {"type": "input_audio", "input_audio": {"data": base64.b64encode(b"nope" * 64).decode(), "format": "mp3"}},
    {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(b"nope" * 64).decode()}},
]


@pytest.mark.parametrize("extra", [{}, {"stream": True}, {"modalities": ["text", "audio"],
                                                          "audio": {"voice": "Ethan", "format": "wav"}}])
@pytest.mark.parametrize("part", [WIDE, *UNREADABLE])
def test_unusable_parts_are_a_400_naming_the_part_without_server_paths(served, part, extra):
    """An image past the processor's aspect ratio, plain, streamed and spoken; unreadable files name their field
    and neither the server's temporary copy nor a Python object."""
    server, _ = served
    body = {"model": _model(server), "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, part]}],
            "max_tokens": 2, **extra}
    with httpx.Client(base_url=server.url, timeout=60) as client:
        r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"].startswith("messages[0].content[1]")
    assert tempfile.gettempdir() not in r.text and "vidloom-upload" not in r.text, r.text
    assert re.search(r"0x[0-9a-fA-F]{4,}", r.text) is None, r.text  # an object's address


def test_audio_parts_stream(served, oc):
    server, gen = served
    part, _ = clip(4, 0.8)
    messages = [{"role": "user", "content": [part, {"type": "text", "text": "what is it?"}]}]
    stream = oc.chat.completions.create(model=_model(server), messages=messages, max_tokens=5, temperature=0,
                                        stream=True)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert text == gen.chat(messages, max_tokens=5, temperature=0.0).text


def test_media_features_are_prepared_on_the_media_pool(served, oc, monkeypatch):
    """Whisper features and image patches of a served chat, spoken or not, are made on the media pool's threads,
    never on the event loop's."""
    from vidloom.models import omni_media as media

    server, _ = served
    threads: list[str] = []
    prepare = media._prepare_part

    def recorded(*args, **kwargs):
        threads.append(threading.current_thread().name)
        return prepare(*args, **kwargs)

    monkeypatch.setattr(media, "_prepare_part", recorded)
    messages, _, _ = conversation(3)
    oc.chat.completions.create(model=_model(server), messages=messages, max_tokens=2, temperature=0)
    oc.chat.completions.create(model=_model(server), messages=messages, max_tokens=2, temperature=0,
                               modalities=["text", "audio"], audio={"voice": "Ethan", "format": "wav"})
    stream = oc.chat.completions.create(model=_model(server), messages=messages, max_tokens=2, temperature=0,
                                        stream=True)
    assert [c for c in stream]
    assert len(threads) >= 3 and all(name.startswith("vidloom-media") for name in threads), threads


def _spoken_pcm(oc, server, messages, voice: str) -> np.ndarray:
    r = oc.chat.completions.create(model=_model(server), messages=messages, max_tokens=6, temperature=0,
                                   modalities=["text", "audio"], audio={"voice": voice, "format": "wav"},
                                   extra_body={"seed": 3})
    with wave.open(io.BytesIO(base64.b64decode(r.choices[0].message.audio.data))) as w:
        return np.frombuffer(w.readframes(w.getnframes()), np.int16)


def test_the_chat_voice_is_the_one_asked_for(served, oc):
    """Ethan and Chelsie answer the same request differently, each as the Python API's chat in that voice."""
    server, gen = served
    messages = [{"role": "user", "content": "Tell me about kites."}]
    spoken = {voice: _spoken_pcm(oc, server, messages, voice) for voice in ("Ethan", "Chelsie")}
    assert not np.array_equal(spoken["Ethan"], spoken["Chelsie"])
    for voice, pcm in spoken.items():
        local = gen.chat(messages, audio={"voice": voice}, max_tokens=6, temperature=0.0, seed=3)
        assert np.array_equal(pcm, np.round(np.clip(local.audio, -1, 1) * 32767).astype(np.int16)), voice


def test_a_chat_whose_media_decode_past_the_limit_is_refused_before_decoding(served, monkeypatch):
    """The issue's reproduction: twenty 29 s MP3 parts (a 780 KB body) decode to 580 s of audio, 37 MB; refused
    from their headers (max_chat_media_bytes, 32 MiB), with decoding made to fail."""
    import vidloom.media.audio_upload as audio_upload
    from tests.helpers.audio_containers import encoded_audio

    server, _ = served
    mp3 = base64.b64encode(encoded_audio("mp3", seconds=29.0, rate=8000, bit_rate=8000)).decode()
    part = {"type": "input_audio", "input_audio": {"data": mp3, "format": "mp3"}}
    body = {"model": _model(server), "messages": [{"role": "user", "content": [part] * 20}], "max_tokens": 2}
    monkeypatch.setattr(audio_upload, "_resampled", lambda *a, **k: pytest.fail("a part was decoded"))
    with httpx.Client(base_url=server.url, timeout=60) as client:
        r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "messages" and "max_chat_media_bytes" in error["message"], error
    assert server.app.state.chat.media.ledger.in_use == 0
