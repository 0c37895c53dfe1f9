"""Qwen2.5-Omni audio and image parts at the boundary: refusals name the part and the limit, and the prompt's
multimodal positions equal transformers' `get_rope_index` (parity of the answers: tests/parity/test_qwen_omni_inputs.py)."""

from __future__ import annotations

import base64
import functools
import types

import numpy as np
import pytest
import torch

from tests.helpers.qwen_omni_checkpoints import AUDIO_CHUNK_S, OMNI_A, write_tiny_omni
from tests.parity.test_qwen_omni_inputs import clip, png_url, wav_bytes
from vidloom.core.chat import ChatMessage, ChatPart, ChatRequest
from vidloom.core.errors import InvalidRequest, LimitExceeded
from vidloom.core.speech import SpeechRequest
from vidloom.generator import VideoGenerator
from vidloom.media.audio_upload import load_input_audio
from vidloom.models.omni_media import IMAGE, MediaPiece, multimodal_positions


@pytest.fixture(scope="module")
def omni(tmp_path_factory):
    torch.set_num_threads(1)
    folder = write_tiny_omni(tmp_path_factory.mktemp("omni"), OMNI_A)
    return VideoGenerator.from_pretrained(str(folder))


@pytest.fixture(scope="module")
def text_only(tmp_path_factory):
    """The same architecture exported without its towers' tensors."""
    folder = write_tiny_omni(tmp_path_factory.mktemp("omni-text"), OMNI_A, encoders=False)
    return VideoGenerator.from_pretrained(str(folder))


def _audio_part(samples: np.ndarray) -> dict:
    return {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav_bytes(samples)).decode(),
                                                   "format": "wav"}}


def test_a_checkpoint_without_towers_refuses_audio_and_images_by_part(text_only):
    audio, _ = clip(1, 0.5)
    url, image = png_url(1, (40, 40))
    with pytest.raises(InvalidRequest) as info:
        text_only.chat([{"role": "user", "content": [{"type": "text", "text": "hi"}, audio]}])
    assert info.value.field == "messages[0].content[1]" and "thinker.audio_tower" in info.value.message
    with pytest.raises(InvalidRequest) as info:
        text_only.chat([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}],
                       audio={"voice": "Ethan"})
    assert info.value.field == "messages[0].content[0]" and "thinker.visual" in info.value.message
    chat = ChatRequest((ChatMessage("user", (ChatPart("image", image=image),)),))
    with pytest.raises(InvalidRequest) as info:
        text_only.engine.submit(SpeechRequest(chat=chat))
    assert info.value.field == "messages[0].content[0]"
    assert text_only.chat([{"role": "user", "content": "hello"}], max_tokens=2, temperature=0.0).completion_tokens == 2  # text still answers


def test_audio_past_the_feature_extractors_window_names_the_part_and_the_limit(omni):
    samples = np.zeros(16000 * (AUDIO_CHUNK_S + 1), np.float32)
    with pytest.raises(LimitExceeded) as info:
        omni.chat([{"role": "user", "content": [_audio_part(samples)]}])
    assert info.value.field == "messages[0].content[0]" and info.value.limit == "chunk_length"
    assert omni.engine.decoder.stats()["kv_blocks_in_use"] == 0


def test_undecodable_audio_and_unknown_formats_name_the_field(omni):
    junk = {"type": "input_audio", "input_audio": {"data": base64.b64encode(b"RIFF not a wave").decode(),
                                                   "format": "wav"}}
    with pytest.raises(InvalidRequest) as info:
        omni.chat([{"role": "user", "content": [junk]}])
    assert info.value.field == "messages[0].content[0].input_audio"
    flac = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "flac"}}
    with pytest.raises(InvalidRequest) as info:
        omni.chat([{"role": "user", "content": [{"type": "text", "text": "hi"}, flac]}])
    assert info.value.field == "messages[0].content[1].input_audio.format"
    bad64 = {"type": "input_audio", "input_audio": {"data": "not base64!", "format": "wav"}}
    with pytest.raises(InvalidRequest) as info:
        omni.chat([{"role": "user", "content": [bad64]}])
    assert info.value.field == "messages[0].content[0].input_audio.data"


def test_remote_image_urls_and_assistant_audio_are_refused(omni):
    with pytest.raises(InvalidRequest) as info:
        omni.chat([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}])
    assert info.value.field == "messages[0].content[0].image_url"
    audio, _ = clip(2, 0.5)
    with pytest.raises(InvalidRequest) as info:
        omni.chat([{"role": "user", "content": "hi"}, {"role": "assistant", "content": [audio]},
                   {"role": "user", "content": "again"}])
    assert info.value.field == "messages[1].content[0].type"


@pytest.mark.parametrize("size", [(600, 2), (2, 600), (201, 1)])
def test_images_past_the_aspect_ratio_limit_name_the_part(omni, size):
    url, _ = png_url(3, size)
    messages = [{"role": "user", "content": [{"type": "text", "text": "what is it?"},
                                             {"type": "image_url", "image_url": {"url": url}}]}]
    for audio in (None, {"voice": "Ethan"}):  # written and spoken answers prepare the prompt alike
        with pytest.raises(InvalidRequest) as info:
            omni.chat(messages, max_tokens=2, audio=audio)
        assert info.value.field == "messages[0].content[1]" and "MAX_IMAGE_ASPECT_RATIO" in info.value.message


def test_an_image_at_the_aspect_ratio_limit_is_read(omni):
    url, _ = png_url(3, (400, 2))
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]
    assert omni.chat(messages, max_tokens=2, temperature=0.0).completion_tokens == 2


def test_input_audio_is_resampled_to_mono_16k():
    t = np.arange(44100) / 44100
    samples = (0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    decoded = load_input_audio(wav_bytes(samples, rate=44100), "wav", "f")
    assert decoded.dtype == np.float32 and abs(decoded.shape[0] - 16000) <= 32
    assert 0.3 < float(np.abs(decoded).max()) < 0.6
    with pytest.raises(InvalidRequest) as info:
        load_input_audio(wav_bytes(samples, rate=44100), "wav", "f", max_seconds=0.5)
    assert info.value.field == "f" and "MAX_INPUT_AUDIO_SECONDS" in info.value.message


def _reference_rope_index(ids: torch.Tensor, grids: torch.Tensor, audio_frames: torch.Tensor):
    from transformers import Qwen2_5OmniThinkerConfig
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniPreTrainedModelForConditionalGeneration as M

    config = Qwen2_5OmniThinkerConfig(image_token_index=8, audio_token_index=3, video_token_index=9,
                                      vision_start_token_id=6, audio_start_token_id=4)
    fake = types.SimpleNamespace(config=config, spatial_merge_size=2)
    fake.get_llm_pos_ids_for_vision = functools.partial(M.get_llm_pos_ids_for_vision, fake)
    return M.get_rope_index(fake, ids[None], grids, None, torch.ones_like(ids)[None], False, audio_frames)


def test_multimodal_positions_equal_get_rope_index():
    # text, an audio clip of 13 frames (3 tokens), a 2x3 merged image, text, a 4x2 merged image, text
    grids = torch.tensor([[1, 4, 6], [1, 8, 4]])
    ids = [1, 20, 21, 4, *[3] * 3, 5, 22, 6, *[8] * 6, 7, 23, 24, 6, *[8] * 8, 7, 2, 25]
    ids_t = torch.tensor(ids)
    image_at = [torch.nonzero(ids_t == 8).flatten()[:6], torch.nonzero(ids_t == 8).flatten()[6:]]
    pieces = [MediaPiece(IMAGE, torch.zeros(1), grids[i:i + 1], at) for i, at in enumerate(image_at)]
    positions, delta = multimodal_positions(len(ids), pieces, merge_size=2)
    expected, expected_delta = _reference_rope_index(ids_t, grids, torch.tensor([13]))
    assert torch.equal(positions, expected[:, 0]) and delta == int(expected_delta)


def test_two_media_prompts_prefill_in_one_forward_as_they_do_alone(omni):
    from tests.parity.test_qwen_omni_inputs import conversation
    from vidloom.core.chat import build_chat_request
    from vidloom.media.image import load_image

    engine = omni.engine
    convs = [conversation(seed)[0] for seed in (1, 2)]
    alone = [omni.chat(messages, max_tokens=5, temperature=0.0).token_ids for messages in convs]
    runs = [engine.submit(build_chat_request(m, load_image=load_image, load_audio=load_input_audio,
                                                 max_tokens=5, temperature=0.0)) for m in convs]
    try:
        for run in runs:
            assert run.prepare()
        rows = engine.decoder.run([run.pending_plan for run in runs])  # both prefills, towers included
        for run, row in zip(runs, rows):
            run.complete(row)
        for run in runs:
            while not run.step():
                pass
        batched = [run.outputs()["completion"].token_ids for run in runs]
    finally:
        for run in runs:
            run.close()
    assert batched == alone and alone[0] != alone[1]
    assert engine.decoder.stats()["kv_blocks_in_use"] == 0
