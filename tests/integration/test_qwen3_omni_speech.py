"""Qwen3-Omni speech as users reach it, on a tiny checkpoint with a talker: `gen.speak` (forced text) and
`gen.chat(audio=...)` greedy through the runtime (thinker and talker on their paged pools, code2wav a chunk per
step) give the frames and waveform our reference-shaped loop gives for the same reply (itself equal to transformers'
generate: tests/parity/test_qwen3_omni_speech_codes.py); a streamed request's chunks arrive before the talker
ends and add up to the whole; voices are the checkpoint's speaker names; the official openai client speaks."""

from __future__ import annotations

import base64
import dataclasses
import io
import wave

import httpx
import numpy as np
import pytest
import torch

from tests.helpers.qwen3_omni_checkpoints import TALKER_A, THINKER_A, write_tiny_thinker
from tests.helpers.servers import ThreadServer
from vidloom.core.chat import SamplingParams
from vidloom.core.errors import InvalidRequest, LimitExceeded
from vidloom.core.output import AudioChunkEvent
from vidloom.core.speech import SpeechRequest
from vidloom.families.qwen3_omni.code2wav import CHUNK_FRAMES, WaveChunks, decode_chunk
from vidloom.families.qwen3_omni.speech_codes import generate_frames, greedy, talker_inputs
from vidloom.generator import VideoGenerator
from vidloom.layers.rotary import text_positions
from vidloom.serving.config import ServeConfig

MESSAGES = [{"role": "user", "content": "tell me about kites"}]


@pytest.fixture(scope="module")
def gen(tmp_path_factory):
    torch.set_num_threads(1)
    folder = write_tiny_thinker(tmp_path_factory.mktemp("q3s") / "qwen3-omni-talker", THINKER_A, talker=TALKER_A)
    return VideoGenerator.from_pretrained(str(folder), device="cpu")


def _expected(gen, ids: list[int], prompt_len: int, voice: str):
    """Frames and waveform of our reference-shaped loop on the same ids (one causal pass for the thinker)."""
    instance = gen.engine.instance
    thinker, talker, code2wav = instance["thinker"], instance["talker"], instance["code2wav"]
    with torch.inference_mode():
        _, tapped = thinker(torch.tensor(ids[:-1]), text_positions(0, len(ids) - 1), return_hidden=True)
        inputs = talker_inputs(talker, thinker.embed, ids, prompt_len, tapped, instance["speech"].speakers[voice],
                               [gen.engine.instance["tokenizer"].eos_token_id])
        frames = generate_frames(talker, inputs, lambda x: int(greedy(x)), lambda x, g: greedy(x), 64)
    chunks = WaveChunks(CHUNK_FRAMES)
    chunks.add(decode_chunk(code2wav, frames, 0, len(frames), chunks.left_context, 0), len(frames))
    return frames, chunks.audio()


def test_speak_greedy_equals_the_reference_loop(gen):
    result = gen.speak("the kite rose over the dunes", voice="Chelsie", greedy=True, max_audio_tokens=64)
    tokenizer = gen.engine.instance["tokenizer"]
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Say the following text exactly as written."}],
                                           tokenize=True, add_generation_prompt=True, return_dict=True)["input_ids"]
    text = tokenizer.encode("the kite rose over the dunes", add_special_tokens=False)
    frames, wave = _expected(gen, list(prompt) + text + [tokenizer.eos_token_id], len(prompt), "chelsie")
    assert result.audio_tokens == len(frames) >= 4 and result.sample_rate == 24000 and result.voice == "chelsie"
    assert np.abs(result.audio - wave).max() <= 1e-5 and len(result.audio) == len(wave)


def test_chat_aloud_greedy_and_streamed(gen):
    whole = gen.chat(MESSAGES, audio={"voice": "ethan", "greedy": True, "max_audio_tokens": 40}, temperature=0.0,
                     max_tokens=8)
    assert whole.text and whole.audio_tokens >= 4 and len(whole.audio) > 0
    # 24 frames: every chunk's 25 frames of left context reach back to the first (the tiny code2wav's causal reach,
    # ~45 frames, is longer than the released one's; tests/parity/test_qwen3_omni_speech_codes.py).
    events = []
    streamed = gen.speak("the kite rose over the dunes", voice="ethan", greedy=True, max_audio_tokens=24,
                         audio_chunk_codes=3, on_event=events.append)
    chunks = [e for e in events if isinstance(e, AudioChunkEvent)]
    assert len(chunks) >= 2
    again = gen.speak("the kite rose over the dunes", voice="ethan", greedy=True, max_audio_tokens=24)
    assert chunks[0].start_sample == 0 and again.audio_tokens == 24
    assert np.abs(np.concatenate([c.audio for c in chunks]) - again.audio).max() <= 1e-5
    assert np.abs(streamed.audio - again.audio).max() <= 1e-5


def test_voices_are_the_checkpoints_speakers(gen):
    with pytest.raises(InvalidRequest) as caught:
        gen.speak("hello", voice="nobody")
    assert caught.value.field == "voice" and "chelsie" in str(caught.value) and "ethan" in str(caught.value)


def test_openai_client_speaks(gen, tmp_path):
    import openai

    config = ServeConfig(data_dir=tmp_path / "data", queue_size=4, graceful_shutdown_s=2)
    with ThreadServer(gen.engine, config) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
        model = server.app.state.jobs.card.model_id
        audio = client.audio.speech.create(model=model, voice="Ethan", input="the kite rose", response_format="wav")
        assert audio.content[:4] == b"RIFF" and len(audio.content) > 44
        r = client.chat.completions.create(model=model, modalities=["text", "audio"], max_tokens=8, temperature=0,
                                           audio={"voice": "chelsie", "format": "wav"}, messages=MESSAGES)
        plain = client.chat.completions.create(model=model, max_tokens=8, temperature=0, messages=MESSAGES)
        message = r.choices[0].message
        with wave.open(io.BytesIO(base64.b64decode(message.audio.data))) as w:
            assert w.getframerate() == 24000 and w.getnframes() > 0
        assert message.audio.transcript == plain.choices[0].message.content  # no system prompt is added
        caps = httpx.get(f"{server.url}/v1/models/{model}", timeout=30).json()["capabilities"]
        assert caps["speech"] and caps["voices"] == ["chelsie", "ethan"]
        assert caps["chat_inputs"] == ["audio", "image", "text", "video"]  # the folder has both towers


def test_concurrent_talkers_decode_in_one_batched_forward_and_match_running_alone(gen):
    """Three speech requests at once: their talker steps share paged forwards, and each gives the frames and
    waveform it gives alone."""
    from tests.helpers.speech_runs import speak_together

    texts = ["the kite rose over the dunes", "a red kite", "kites fly high above the sea at noon"]

    def request(text: str) -> SpeechRequest:
        return SpeechRequest(text=text, voice="chelsie", talker_sampling=SamplingParams(temperature=0.0),
                             max_audio_tokens=16)

    solo = [gen.engine.submit(request(text)).finish() for text in texts]
    outs, batches = speak_together(gen, [request(text) for text in texts], "interleave",
                                   talker=gen.engine.instance["talker"].decoder)
    assert max(batches) == 3
    for out, ref in zip(outs, solo):
        assert out["frames"].tolist() == ref["frames"].tolist() and len(out["frames"]) > 3
        # Batched: keys padded to the longest sequence (float32 summation order).
        np.testing.assert_allclose(out["audio"], ref["audio"], atol=1e-4, rtol=0)
    assert gen.engine.decoder.stats()["kv_blocks_in_use"] == 0


def test_seeded_sampling_repeats_and_differs_from_greedy(gen):
    """The reference's samplers (talker: temperature 0.9, top-k 50; code predictor: top-k 50, top-p 0.8), seeded."""
    first = gen.speak("the kite rose over the dunes", voice="ethan", seed=7, max_audio_tokens=24)
    again = gen.speak("the kite rose over the dunes", voice="ethan", seed=7, max_audio_tokens=24)
    greedy = gen.speak("the kite rose over the dunes", voice="ethan", greedy=True, max_audio_tokens=24)
    assert np.array_equal(first.audio, again.audio)
    assert len(first.audio) != len(greedy.audio) or not np.allclose(first.audio, greedy.audio)


def test_a_small_memory_limit_refuses_a_long_utterance_naming_its_field(gen, monkeypatch):
    """The card's estimate (families.qwen3_omni.memory) against max_request_memory: 1000 frames of a long text are
    refused by the field that sizes them, a short utterance still speaks."""
    engine = gen.engine
    monkeypatch.setattr(engine, "limits", dataclasses.replace(engine.limits, max_memory_bytes=136 << 20))
    with pytest.raises(LimitExceeded) as caught:
        gen.speak("the kite rose over the dunes " * 60, greedy=True, max_audio_tokens=1000)
    assert caught.value.field == "max_audio_tokens" and "max_request_memory" in str(caught.value)
    assert gen.speak("a kite", greedy=True, max_audio_tokens=4).audio_tokens >= 1


def _media_messages(seed: int) -> list[dict]:
    from tests.parity.test_qwen_omni_inputs import clip, png_url

    audio, _ = clip(seed, 1.3)
    url, _ = png_url(seed, (90, 70))
    return [{"role": "user", "content": [audio, {"type": "text", "text": "what is a kite?"},
                                         {"type": "image_url", "image_url": {"url": url}}]}]


def test_openai_client_answers_aloud_with_audio_and_image_parts_as_the_python_api(gen, tmp_path):
    """A spoken chat with an input_audio and an image_url part (seeded talker) over the server equals the Python
    API's, transcript and waveform (those equal transformers': tests/parity/test_qwen3_omni_spoken_media.py)."""
    import openai

    messages = _media_messages(3)
    local = gen.chat(messages, audio={"voice": "chelsie"}, temperature=0.0, max_tokens=8, seed=11)
    config = ServeConfig(data_dir=tmp_path / "data", queue_size=4, graceful_shutdown_s=2)
    with ThreadServer(gen.engine, config) as server:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
        model = server.app.state.jobs.card.model_id
        r = client.chat.completions.create(model=model, modalities=["text", "audio"], max_tokens=8, temperature=0,
                                           seed=11, audio={"voice": "chelsie", "format": "pcm16"},
                                           messages=messages)
        assert server.app.state.jobs.engine.chat_stats()["kv_blocks_in_use"] == 0
    message = r.choices[0].message
    samples = np.frombuffer(base64.b64decode(message.audio.data), dtype="<i2")
    assert message.audio.transcript == local.text and local.audio_tokens >= 4
    assert samples.shape == local.audio.shape
    assert np.abs(samples / 32768 - local.audio).max() <= 1 / 32768 + 1e-6  # pcm16's rounding


def test_the_speech_estimate_counts_the_towers_of_a_spoken_chat_with_media(gen):
    """The media's towers pass (omni_towers.towers_bytes) joins the thinker's prefill in the speech estimate (a stage
    of the largest: the talker's may hide part of it)."""
    from vidloom.core.chat import build_chat_request
    from vidloom.families.qwen3_omni.speech import speech_prompt
    from vidloom.media.audio_upload import load_input_audio
    from vidloom.media.image import load_image
    from vidloom.models.omni_towers import instance_towers_bytes

    engine = gen.engine
    chat = build_chat_request(_media_messages(3), load_image=load_image, load_audio=load_input_audio, max_tokens=8)
    prompt = speech_prompt(engine.instance, engine.decoder.limits, SpeechRequest(chat=chat, voice="chelsie"))
    assert prompt.media is not None and len(prompt.media.pieces) == 2
    assert instance_towers_bytes(engine.instance, prompt.media, 4) > 0
    assert engine.estimator(prompt) > engine.estimator(dataclasses.replace(prompt, media=None))
