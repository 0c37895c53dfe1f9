"""/v1/audio/speech on a tiny Qwen2.5-Omni checkpoint, as clients use it: uvicorn on 127.0.0.1, the official openai
package (plain and with_streaming_response), httpx for raw SSE and error bodies."""

from __future__ import annotations

import base64
import io
import json
import wave

import av
import httpx
import numpy as np
import pytest
import torch

from tests.helpers.qwen_omni_checkpoints import OMNI_A, write_tiny_omni
from tests.helpers.servers import ThreadServer
from vidloom.families.qwen_omni.cards import SPOKEN_SYSTEM_PROMPT
from vidloom.serving.config import ServeConfig


@pytest.fixture(scope="module")
def speech_server(tmp_path_factory):
    from vidloom.generator import VideoGenerator

    torch.set_num_threads(1)
    folder = write_tiny_omni(tmp_path_factory.mktemp("omni") / "omni-tiny", OMNI_A)
    engine = VideoGenerator.from_pretrained(str(folder), device="cpu").engine
    config = ServeConfig(data_dir=tmp_path_factory.mktemp("speech-data"), queue_size=8, graceful_shutdown_s=2)
    with ThreadServer(engine, config) as running:
        yield running


@pytest.fixture
def oc(speech_server):
    import openai

    return openai.OpenAI(base_url=f"{speech_server.url}/v1", api_key="unused", max_retries=0)


SEEDED = {"extra_body": {"seed": 3}}  # vidloom's extension: a random talker's sampled length is then fixed


def model_id(server) -> str:
    return server.app.state.jobs.card.model_id


def test_speech_wav_with_the_openai_client(speech_server, oc):
    audio = oc.audio.speech.create(model=model_id(speech_server), voice="Chelsie", input="the kite rose",
                                   response_format="wav", **SEEDED)
    with wave.open(io.BytesIO(audio.content)) as w:
        assert w.getframerate() == 24000 and w.getnchannels() == 1 and w.getnframes() > 0
    pool = speech_server.app.state.jobs.engine.chat_stats()
    assert pool["kv_blocks_in_use"] == 0  # the thinker's sequence returned its blocks


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac"])
def test_compressed_formats_decode(speech_server, oc, fmt):
    audio = oc.audio.speech.create(model=model_id(speech_server), voice="Ethan", input="hello world",
                                   response_format=fmt, **SEEDED)
    with av.open(io.BytesIO(audio.content)) as container:
        frames = sum(f.samples for f in container.decode(container.streams.audio[0]))
    assert frames > 0


def test_streaming_response_audio(speech_server, oc, tmp_path):
    with oc.audio.speech.with_streaming_response.create(
            model=model_id(speech_server), voice="Ethan", input="the kite rose over the dunes",
            response_format="pcm", stream_format="audio", **SEEDED) as response:
        data = b"".join(response.iter_bytes())
    assert len(data) > 0 and len(data) % 2 == 0  # 16-bit samples


def test_speed_stretches_time(speech_server, oc):
    common = dict(model=model_id(speech_server), voice="Chelsie", input="the kite rose over the dunes",
                  response_format="pcm")
    normal = oc.audio.speech.create(**common, **SEEDED).content
    fast = oc.audio.speech.create(**common, speed=2.0, **SEEDED).content
    assert len(normal) > 0 and len(fast) == 2 * round(len(normal) / 2 / 2)  # half the 16-bit samples


def test_sse_events(speech_server):
    body = {"model": model_id(speech_server), "voice": "Chelsie", "input": "hello world", "response_format": "pcm",
            "stream_format": "sse", "seed": 3}
    with httpx.Client(base_url=speech_server.url, timeout=120) as client:
        r = client.post("/v1/audio/speech", json=body)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
    assert [e["type"] for e in events[:-1]] == ["speech.audio.delta"] * (len(events) - 1) and len(events) >= 2
    assert events[-1]["type"] == "speech.audio.done" and events[-1]["usage"]["output_tokens"] > 0
    pcm = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    # 16-bit samples: each code is `repeats` (2) mel frames of the vocoder's hop (4 x 2 in OMNI_A) samples
    assert len(pcm) == 2 * 2 * 8 * events[-1]["usage"]["output_tokens"]


@pytest.mark.parametrize(("field", "value", "says"), [
    ("input", "", "non-empty"),
    ("input", "x" * 4097, "4096"),
    ("voice", "Alloy", "Chelsie, Ethan"),
    ("voice", {"name": "Ethan"}, '{"id": voice name}'),  # spoke in the default voice before
    ("response_format", "ogg", "mp3, opus, aac, flac, wav, pcm"),
    ("speed", 5.0, "0.25 to 4.0"),
    ("speed", 0.1, "0.25 to 4.0"),
    ("stream_format", "chunks", ""),
    ("seed", -1, ">= 0"),
])
def test_bad_input_is_a_400_naming_the_field(speech_server, field, value, says):
    body = {"model": model_id(speech_server), "voice": "Chelsie", "input": "hello", field: value}
    with httpx.Client(base_url=speech_server.url, timeout=60) as client:
        r = client.post("/v1/audio/speech", json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == field or field in error["message"]
    assert says in error["message"]


def test_unknown_model_name_is_refused(speech_server):
    with httpx.Client(base_url=speech_server.url, timeout=60) as client:
        r = client.post("/v1/audio/speech", json={"model": "tts-1", "voice": "Chelsie", "input": "hi"})
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"


def test_chat_completion_answers_aloud(speech_server, oc):
    r = oc.chat.completions.create(model=model_id(speech_server), modalities=["text", "audio"],
                                   audio={"voice": "Ethan", "format": "wav"}, max_tokens=8, temperature=0,
                                   messages=[{"role": "user", "content": "Tell me about kites in one sentence."}])
    message = r.choices[0].message
    assert message.content is None and message.audio.id and message.audio.expires_at > 0
    with wave.open(io.BytesIO(base64.b64decode(message.audio.data))) as w:
        assert w.getframerate() == 24000 and w.getnframes() > 0
    # The spoken text is the greedy reply under the model card's documented system prompt (added when none is given).
    plain = oc.chat.completions.create(model=model_id(speech_server), max_tokens=8, temperature=0,
                                       messages=[{"role": "system", "content": SPOKEN_SYSTEM_PROMPT},
                                                 {"role": "user", "content": "Tell me about kites in one sentence."}])
    assert message.audio.transcript == plain.choices[0].message.content
    assert r.usage.completion_tokens > plain.usage.completion_tokens  # text tokens plus speech codes


@pytest.mark.parametrize("fmt", ["pcm16", "mp3"])
def test_chat_completion_streams_transcript_then_audio(speech_server, oc, fmt):
    stream = oc.chat.completions.create(model=model_id(speech_server), modalities=["text", "audio"],
                                        audio={"voice": "Chelsie", "format": fmt}, max_tokens=8, temperature=0,
                                        stream=True, messages=[{"role": "user", "content": "what is a kite?"}])
    pieces = [getattr(chunk.choices[0].delta, "audio", None) for chunk in stream if chunk.choices]
    pieces = [p for p in pieces if p]
    # The client parses each delta.audio into its ChoiceDeltaAudio (id, transcript, data, expires_at).
    transcript = "".join(p.transcript or "" for p in pieces)
    data = b"".join(base64.b64decode(p.data) for p in pieces if p.data)
    kinds = [next(k for k in ("transcript", "data", "expires_at") if getattr(p, k, None)) for p in pieces]
    assert kinds.index("data") > kinds.index("transcript") and kinds[-1] == "expires_at"
    assert transcript and len(data) > 0
    assert len(data) % 2 == 0 if fmt == "pcm16" else decoded_seconds(data) > 0  # the pieces make one mp3
    assert speech_server.app.state.jobs.engine.chat_stats()["kv_blocks_in_use"] == 0


@pytest.mark.parametrize(("extra", "param"), [
    ({"modalities": ["text", "audio"]}, "audio"),
    ({"modalities": ["text", "audio"], "audio": {"voice": "Chelsie", "format": "aiff"}}, "audio.format"),
    ({"modalities": ["text", "audio"], "audio": {"voice": "Bob", "format": "wav"}}, "voice"),
    ({"modalities": ["audio"], "audio": {"voice": "Chelsie", "format": "wav"}}, "modalities"),
    ({"audio": {"voice": "Chelsie", "format": "wav"}}, "audio"),
])
def test_bad_audio_chat_is_a_400_naming_the_field(speech_server, extra, param):
    body = {"model": model_id(speech_server), "messages": [{"role": "user", "content": "hi"}], **extra}
    with httpx.Client(base_url=speech_server.url, timeout=60) as client:
        r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_a_client_that_leaves_frees_the_thinker_and_talker_blocks(speech_server, monkeypatch):
    """A long utterance (its talker runs thousands of steps), abandoned while it speaks: the pool and the cache
    manager return to where they were."""
    import time

    engine = speech_server.app.state.jobs.engine
    [talker] = [node.loop for node in engine.engine.program.nodes if node.name == "talker"]
    monkeypatch.setattr(talker, "end_ids", frozenset())  # it speaks until its cap (thousands of codes)
    before = engine.engine.caches.bytes_in_use
    long_text = "the kite rose over the dunes and the wind sang " * 60  # ~2800 characters
    body = {"model": model_id(speech_server), "voice": "Chelsie", "input": long_text, "response_format": "pcm"}
    with httpx.Client(base_url=speech_server.url, timeout=httpx.Timeout(60, read=1.0)) as client:
        with pytest.raises(httpx.ReadTimeout):
            client.post("/v1/audio/speech", json=body)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (engine.chat_stats()["kv_blocks_in_use"] or
                                           engine.engine.caches.bytes_in_use != before):
        time.sleep(0.05)
    assert engine.chat_stats()["kv_blocks_in_use"] == 0
    assert engine.engine.caches.bytes_in_use == before


def hold_the_talker_until_audio_arrives(speech_server, monkeypatch):
    """The talker speaks to its cap and its next-to-last step waits until the client holds audio: if audio left
    only after the talker, that wait would time out. Returns (first_audio event, waits, the caps it ran to)."""
    import threading

    from vidloom.families.qwen_omni.stream_audio import AudioPiece

    engine = speech_server.app.state.jobs.engine
    [talker] = [node.loop for node in engine.engine.program.nodes if node.name == "talker"]
    monkeypatch.setattr(talker, "end_ids", frozenset())  # it speaks to its cap (>= 64 codes)
    first_audio, waited, caps = threading.Event(), [], []
    advance = talker.advance

    def gated(state, result):
        state = advance(state, result)
        if not isinstance(result, AudioPiece) and len(state.codes) == state.max_codes - 1:
            caps.append(state.max_codes)
            waited.append(first_audio.wait(60))
        return state

    monkeypatch.setattr(talker, "advance", gated)
    return first_audio, waited, caps


def decoded_seconds(data: bytes) -> float:
    with av.open(io.BytesIO(data)) as container:
        frames = list(container.decode(container.streams.audio[0]))
    return sum(f.samples for f in frames) / frames[0].sample_rate


def test_first_audio_leaves_before_the_talker_finishes(speech_server, monkeypatch):
    """Ordering, not timing (the talker waits for the client's first audio). The streamed WAV (unknown sizes)
    then decodes whole."""
    engine = speech_server.app.state.jobs.engine
    first_audio, waited, _ = hold_the_talker_until_audio_arrives(speech_server, monkeypatch)
    body = {"model": model_id(speech_server), "voice": "Chelsie", "input": "hello world", "response_format": "wav",
            "stream_format": "sse"}
    audio = b""
    with httpx.Client(base_url=speech_server.url, timeout=120) as client:
        with client.stream("POST", "/v1/audio/speech", json=body) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: ") and '"speech.audio.delta"' in line:
                    audio += base64.b64decode(json.loads(line[6:])["audio"])
                    first_audio.set()
    assert waited == [True]
    with av.open(io.BytesIO(audio)) as container:
        samples = sum(f.samples for f in container.decode(container.streams.audio[0]))
    assert samples == (len(audio) - 44) // 2 and samples % (2 * 8) == 0  # whole codes: 2 mel frames x hop 8
    assert engine.chat_stats()["kv_blocks_in_use"] == 0


# format, speed, one codec frame in seconds (mp3 1152 samples, Opus 20 ms, AAC 1024; flac and wav: exact)
@pytest.mark.parametrize(("fmt", "speed", "frame_s"), [
    ("mp3", 1.0, 1152 / 24000), ("opus", 1.0, 0.02), ("aac", 1.0, 1024 / 24000), ("flac", 1.0, 1 / 24000),
    ("wav", 1.5, 1 / 24000), ("mp3", 0.8, 1152 / 24000),
])
def test_compressed_and_stretched_audio_streams_while_the_talker_decodes(speech_server, monkeypatch, fmt, speed,
                                                                         frame_s):
    """Bytes of every format (and speed) leave before the talker's last code; the streamed file decodes to the
    duration of the same number of samples encoded whole, within one codec frame."""
    from vidloom.media.speech_audio import encode_speech

    first_audio, waited, caps = hold_the_talker_until_audio_arrives(speech_server, monkeypatch)
    # ~24 text tokens: a cap of ~380 codes (16 per token), ~6k samples at the tiny vocoder's hop, so the codecs
    # have whole frames to write long before the end
    body = {"model": model_id(speech_server), "voice": "Ethan", "input": "the kite rose over the dunes " * 4,
            "response_format": fmt, "speed": speed, "stream_format": "audio", "seed": 3}
    pieces = []
    with httpx.Client(base_url=speech_server.url, timeout=120) as client:
        with client.stream("POST", "/v1/audio/speech", json=body) as r:
            assert r.status_code == 200
            for data in r.iter_bytes():
                pieces.append(data)
                first_audio.set()
    assert waited == [True] and len(pieces) > 1
    samples = round(caps[0] * 2 * 8 / speed)  # every code spoken: 2 mel frames x hop 8, stretched
    whole = decoded_seconds(encode_speech(np.zeros(samples, np.float32), 24000, fmt))
    assert abs(decoded_seconds(b"".join(pieces)) - whole) <= frame_s + 1e-9
    assert speech_server.app.state.jobs.engine.chat_stats()["kv_blocks_in_use"] == 0


def test_speech_over_the_memory_budget_is_a_400_naming_input(speech_server, monkeypatch):
    import dataclasses

    engine = speech_server.app.state.jobs.engine.engine
    monkeypatch.setattr(engine, "limits", dataclasses.replace(engine.limits, max_memory_bytes=1 << 20))
    body = {"model": model_id(speech_server), "voice": "Chelsie", "input": "hello", "stream_format": "sse",
            "response_format": "pcm"}
    with httpx.Client(base_url=speech_server.url, timeout=60) as client:
        r = client.post("/v1/audio/speech", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "input" and "max_request_memory" in r.json()["error"]["message"]
    assert speech_server.app.state.jobs.engine.chat_stats()["kv_blocks_in_use"] == 0


def test_a_streamed_client_that_leaves_after_the_first_chunk_frees_everything(speech_server, monkeypatch):
    import time

    engine = speech_server.app.state.jobs.engine
    [talker] = [node.loop for node in engine.engine.program.nodes if node.name == "talker"]
    monkeypatch.setattr(talker, "end_ids", frozenset())  # thousands of codes: it is still speaking when we leave
    advance = talker.advance

    def slow_advance(state, logits):  # >= 20 s for its 4096 codes: a starved event loop cannot see it finish first
        time.sleep(0.005)
        return advance(state, logits)

    monkeypatch.setattr(talker, "advance", slow_advance)
    before = engine.engine.caches.bytes_in_use
    body = {"model": model_id(speech_server), "voice": "Chelsie", "input": "the kite rose over the dunes " * 40,
            "response_format": "pcm", "stream_format": "audio"}
    with httpx.Client(base_url=speech_server.url, timeout=120) as client:
        with client.stream("POST", "/v1/audio/speech", json=body) as r:
            assert r.status_code == 200 and len(next(r.iter_bytes())) > 0  # the first chunk, then gone
            talker_pool = engine.engine.decoder.pool_of(engine.engine.instance["talker"])
            assert talker_pool.allocator.blocks_in_use > 0  # left mid-stream: the talker's sequence is in its pool
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (engine.chat_stats()["kv_blocks_in_use"] or
                                           engine.engine.caches.bytes_in_use != before):
        time.sleep(0.05)
    assert engine.chat_stats()["kv_blocks_in_use"] == 0 and engine.engine.caches.bytes_in_use == before
    assert engine.engine.admission.resident == 0
