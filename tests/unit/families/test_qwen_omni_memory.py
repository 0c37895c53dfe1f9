"""Memory admission of speech requests: the card's estimate (thinker prefill, talker pass, token2wav and
vocoder activations; both KV sequences live in the engine's paged pools) refuses a request that cannot fit by the field that sizes it, before anything runs, and
keeps a second request queued while the first holds the budget."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.helpers.qwen_omni_checkpoints import OMNI_A, write_tiny_omni
from vidloom.core.chat import SamplingParams
from vidloom.core.errors import CacheBudgetExceeded, LimitExceeded
from vidloom.core.speech import SpeechRequest
from vidloom.generator import VideoGenerator
from vidloom.families.qwen_omni.memory import footprint
from vidloom.families.qwen_omni.speech import speech_prompt
from vidloom.runtime.admission import MemoryAdmission

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def gen(tmp_path_factory):
    torch.set_num_threads(1)
    return VideoGenerator.from_pretrained(str(write_tiny_omni(tmp_path_factory.mktemp("omni"), OMNI_A)))


def speech(codes: int) -> SpeechRequest:
    return SpeechRequest(text="the kite rose over the dunes", voice="Chelsie", talker_sampling=GREEDY, seed=1,
                         max_audio_tokens=codes)


def estimate(gen: VideoGenerator, request: SpeechRequest) -> int:
    engine = gen.engine
    return engine.estimator(speech_prompt(engine.instance, engine.decoder.limits, request))


def test_the_card_estimates_speech(gen):
    engine = gen.engine
    assert engine.estimator is not None and engine.limits.max_memory_bytes is not None
    small, large = estimate(gen, speech(16)), estimate(gen, speech(4000))
    assert 0 < small < large  # more codes: a longer talker sequence, DiT pass and waveform
    prompt = speech_prompt(engine.instance, engine.decoder.limits, speech(100))
    parts = footprint(engine.instance, prompt)
    talker = engine.instance["talker"].config
    gathered = 2 * (len(prompt.prompt_ids) + 100) * talker.num_key_value_heads * talker.head_dim * 4
    assert parts.denoise >= gathered  # a talker step's keys and values gathered from its pool, one layer
    assert parts.caches > 0  # the thinker's hidden states the talker reads
    assert parts.denoise > 0 and parts.decode > 0 and parts.persistent >= 3 * 100 * 2 * 8 * 4


def test_a_request_over_the_budget_is_refused_by_name_before_it_runs(gen, monkeypatch):
    engine = gen.engine
    needed = estimate(gen, speech(4000))
    monkeypatch.setattr(engine, "limits", dataclasses.replace(engine.limits, max_memory_bytes=needed - 1))
    before, events = engine.caches.bytes_in_use, []
    with pytest.raises(LimitExceeded) as info:
        engine.submit(speech(4000), events.append)
    assert info.value.field == "max_audio_tokens" and "max_request_memory" in info.value.message
    assert events == [] and engine.caches.bytes_in_use == before
    assert engine.decoder.stats()["kv_blocks_in_use"] == 0 and engine.admission.resident == 0
    with pytest.raises(LimitExceeded) as info:  # no max_audio_tokens: the text sizes the codes
        engine.submit(dataclasses.replace(speech(4000), max_audio_tokens=None,
                                                 text="the kite " * 400))
    assert info.value.field == "input"
    assert gen.speak("the kite", voice="Chelsie", max_audio_tokens=8) is not None  # a small one still runs


def test_resident_requests_share_the_budget(gen, monkeypatch):
    engine = gen.engine
    needed = estimate(gen, speech(64))
    monkeypatch.setattr(engine, "admission", MemoryAdmission(needed + needed // 2))
    first, second = engine.submit(speech(64)), engine.submit(speech(64))
    try:
        assert first.admit() and not second.admit()  # the queue keeps the second waiting
        with pytest.raises(CacheBudgetExceeded):  # stepped without a queue: refused before any work
            second.step()
        while not first.step():
            pass
    finally:
        first.close()
    try:
        assert second.admit()  # room again once the first is done
    finally:
        second.close()
    assert engine.admission.resident == 0 and engine.decoder.stats()["kv_blocks_in_use"] == 0


def test_audio_and_image_parts_add_their_towers_to_the_estimate(gen):
    from tests.parity.test_qwen_omni_inputs import conversation
    from vidloom.core.chat import build_chat_request
    from vidloom.media.audio_upload import load_input_audio
    from vidloom.media.image import load_image

    messages, _, _ = conversation(1)
    chat = build_chat_request(messages, load_image=load_image, load_audio=load_input_audio, max_tokens=4)
    instance = gen.engine.instance
    prompt = speech_prompt(instance, gen.engine.decoder.limits,
                           SpeechRequest(chat=chat, voice="Chelsie", max_audio_tokens=8))
    towers = footprint(instance, prompt).total - footprint(instance, dataclasses.replace(prompt, media=None)).total
    rows = int(prompt.media.at.shape[0]) * instance["thinker"].config.hidden_size * 4
    patches = prompt.media.pieces[1].inputs.numel() * 4  # the image's patches, float32
    assert towers > rows + patches  # the rows, the widest part's inputs and its block's activations


def test_a_text_answer_with_media_holds_its_towers_on_the_admission_ledger(gen):
    """A chat answered in text is admitted on its decode working set (PagedDecoder.memory_bytes): with audio and
    image parts, that includes the towers' pass (MediaChatLoop.media_bytes), which runs inside its prefill step."""
    from tests.parity.test_qwen_omni_inputs import conversation
    from vidloom.core.chat import build_chat_request
    from vidloom.media.audio_upload import load_input_audio
    from vidloom.media.image import load_image
    from vidloom.families.qwen_omni.memory import SCORE_COPIES

    messages, _, _ = conversation(1)
    decoder = gen.engine.decoder
    prompt = decoder.chat_slots(build_chat_request(messages, load_image=load_image, load_audio=load_input_audio,
                                                   max_tokens=4))["chat"]
    towers = decoder.memory_bytes(prompt) - decoder.memory_bytes(dataclasses.replace(prompt, media=None))
    image = prompt.media.pieces[1]
    vision = gen.engine.instance["encoders"].vision.config
    scores = SCORE_COPIES * vision.num_heads * image.inputs.shape[0] ** 2 * 4  # every patch sees every patch
    assert towers > scores + image.inputs.numel() * 4


def test_speech_longer_than_the_talker_pool_is_refused_by_name_before_it_runs(tmp_path):
    from vidloom.core.deploy import DeployConfig

    folder = write_tiny_omni(tmp_path / "omni", OMNI_A)
    small = VideoGenerator.from_pretrained(str(folder), deploy=DeployConfig(kv_pool_tokens=256))
    with pytest.raises(LimitExceeded) as info:
        small.engine.submit(speech(1000))  # ~20 prompt rows + 1000 codes: never fits 256 tokens
    assert info.value.field == "max_audio_tokens" and info.value.limit == "kv_pool_tokens"
    assert "256" in info.value.message and small.engine.decoder.stats()["kv_blocks_in_use"] == 0
    assert small.speak("the kite", voice="Chelsie", max_audio_tokens=32) is not None  # one that fits still runs
