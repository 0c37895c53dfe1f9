"""Qwen2.5-Omni speech requests at the runtime boundary: refusals name the field, and however a run ends its
thinker and talker blocks go back (no parity here: tests/parity/test_qwen_omni_speech.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.qwen_omni_checkpoints import OMNI_A, load_reference, write_tiny_omni
from vidloom.core.chat import ChatMessage, ChatPart, ChatRequest, SamplingParams
from vidloom.core.errors import Cancelled, InvalidRequest
from vidloom.core.output import ProgressEvent
from vidloom.core.speech import SpeechRequest
from vidloom.generator import VideoGenerator


@pytest.fixture(scope="module")
def omni(tmp_path_factory):
    torch.set_num_threads(1)
    folder = write_tiny_omni(tmp_path_factory.mktemp("omni"), OMNI_A)
    return folder, VideoGenerator.from_pretrained(str(folder))


def test_unknown_voice_names_voice_and_lists_the_voices(omni):
    _, gen = omni
    with pytest.raises(InvalidRequest) as info:
        gen.speak("hello", voice="Alloy")
    assert info.value.field == "voice" and "Chelsie, Ethan" in info.value.message


@pytest.mark.parametrize("text", ["", "   "])
def test_empty_input_is_refused(omni, text):
    _, gen = omni
    with pytest.raises(InvalidRequest) as info:
        gen.speak(text)
    assert info.value.field == "input"


def test_speak_returns_audio_and_rate(omni):
    _, gen = omni
    result = gen.speak("the kite rose", voice="Ethan", seed=1, max_audio_tokens=6)
    assert result.sample_rate == 24000 and result.voice == "Ethan" and result.text == "the kite rose"
    assert 0 < result.audio_tokens <= 6 and len(result.audio) == result.audio_tokens * 2 * 8  # 2 frames x hop 8
    assert result.audio.dtype.name == "float32"


def test_cancel_in_the_talker_frees_thinker_and_talker_blocks(omni):
    _, gen = omni
    engine = gen.engine
    before = engine.caches.bytes_in_use
    events: list = []
    run = engine.submit(SpeechRequest(text="the kite rose over the dunes", seed=1, max_audio_tokens=64),
                       events.append)
    try:
        while not any(isinstance(e, ProgressEvent) and e.phase == "talker" for e in events):
            assert not run.step()
        talker_pool = engine.decoder.pool_of(engine.instance["talker"])
        assert talker_pool.allocator.blocks_in_use > 0  # the talker's sequence holds blocks of its own pool
        run.cancel.cancel()
        with pytest.raises(Cancelled):
            while not run.step():
                pass
    finally:
        run.close()
    assert engine.decoder.stats()["kv_blocks_in_use"] == 0
    assert engine.caches.bytes_in_use == before


def test_chat_through_the_thinker_matches_transformers(omni):
    folder, gen = omni
    model = load_reference(folder)
    tokenizer = gen.engine.instance["tokenizer"]
    messages = [{"role": "user", "content": "what is a kite?"}]
    result = gen.chat(messages, temperature=0.0, max_tokens=8)
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.thinker.generate(ids["input_ids"], max_new_tokens=8, do_sample=False,
                                 eos_token_id=[tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|endoftext|>")])
    assert list(result.token_ids) == out[0, ids["input_ids"].shape[1]:].tolist()


def test_a_checkpoint_without_talker_chats_but_does_not_speak(tmp_path):
    folder = write_tiny_omni(tmp_path / "mute", OMNI_A, enable_audio_output=False)
    gen = VideoGenerator.from_pretrained(str(folder))
    assert gen.card.speech is None and "talker" not in gen.engine.instance.components
    assert gen.chat([{"role": "user", "content": "hello"}], temperature=0.0, max_tokens=3).completion_tokens > 0
    with pytest.raises(InvalidRequest) as info:
        gen.speak("hello")
    assert info.value.field == "model"


def test_speech_and_chats_share_decode_rounds_and_match_running_alone(omni):
    """Speech thinker steps batched with chat steps in one paged forward (hidden states split per sequence) give
    what each gives alone."""
    import asyncio

    from vidloom.core.chat import build_chat_request
    from vidloom.runtime.async_engine import AsyncEngine

    _, gen = omni
    chat_q = ChatRequest((ChatMessage("user", (ChatPart("text", "what is a kite?"),)),),
                         SamplingParams(temperature=0.0, max_tokens=8))

    def speech_request() -> SpeechRequest:
        return SpeechRequest(chat=chat_q, voice="Ethan", talker_sampling=SamplingParams(temperature=0.0), seed=2,
                             max_audio_tokens=12)

    alone_speech = gen.chat(chat_q.messages, audio={"voice": "Ethan", "max_audio_tokens": 12, "greedy": True},
                            temperature=0, max_tokens=8, seed=2)
    alone_chat = gen.chat([{"role": "user", "content": "hello world"}], temperature=0, max_tokens=12)
    rounds = []
    engine = AsyncEngine(gen.engine, slots=2)
    real_run = gen.engine.decoder.run
    gen.engine.decoder.run = lambda plans: rounds.append(len(plans)) or real_run(plans)
    try:
        async def both():
            speech = engine.submit(speech_request())
            request = build_chat_request([{"role": "user", "content": "hello world"}], temperature=0, max_tokens=12)
            items = [item async for item in engine.chat(request)]
            return await speech.result(), items[-1]

        spoken, chat = asyncio.run(both())
    finally:
        gen.engine.decoder.run = real_run
        engine.close()
    assert max(rounds) == 2  # at least one forward held the speech's thinker step and the chat's step
    assert chat.token_ids == alone_chat.token_ids and spoken.text == alone_speech.text
    assert spoken.audio_tokens == alone_speech.audio_tokens
    # The batched forward pads and packs differently (float32 summation order): the same codes, waveforms equal
    # to ~1e-6; a hidden state handed to the wrong sequence would change the codes or move the wave by >1e-2.
    np.testing.assert_allclose(spoken.audio, alone_speech.audio, atol=1e-4, rtol=0)


def test_concurrent_talkers_decode_in_one_batched_forward_and_match_running_alone(omni):
    """Three speech requests at once: their talker steps share paged forwards (counted on the talker's forward),
    and each gives the codes and waveform it gives alone."""
    from tests.helpers.speech_runs import speak_together

    _, gen = omni
    texts = ["the kite rose over the dunes", "a red kite", "kites fly high above the sea at noon"]

    def request(text: str) -> SpeechRequest:
        return SpeechRequest(text=text, voice="Chelsie", talker_sampling=SamplingParams(temperature=0.0), seed=3,
                             max_audio_tokens=16)

    def alone(text: str) -> dict:
        return gen.engine.submit(request(text)).finish()

    solo = [alone(text) for text in texts]
    outs, batches = speak_together(gen, [request(text) for text in texts], "interleave")  # fifo: one by one
    steps = sum(int(out["codes"].numel()) + 1 for out in solo)  # a step per code, and the one that ends
    assert max(batches) == 3 and len(batches) < steps  # talker steps of the three requests in one forward
    for out, ref in zip(outs, solo):
        assert out["codes"].tolist() == ref["codes"].tolist() and out["codes"].numel() > 3
        # Batched: keys padded to the longest sequence (float32 summation order); 1e-4 as the test above.
        np.testing.assert_allclose(out["audio"], ref["audio"], atol=1e-4, rtol=0)
    assert gen.engine.decoder.stats()["kv_blocks_in_use"] == 0
