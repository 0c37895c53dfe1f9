"""A Qwen3-Omni chat answered aloud with an audio part, an image part, both, or a video part (with or without its
sound track), against transformers' `generate(..., return_audio=True)` on the two tiny checkpoints the speech-code
parity uses, greedy on both sides: through the runtime (thinker with its towers on the paged pool, talker on its
own, code2wav a chunk per step) the thinker's reply ids and every codebook of every codec frame are identical, the
waveform within WAVE (the speech codes test's bound: the same code2wav on the same frames).

The talker's prompt holds the media rows (hidden_projection of the thinker's states at accept_hidden_layer) at
the talker's own multimodal positions (an image's rows on its merged grid, a video's over grid and time).
transformers 5.25 fails on audio and an image together (its talker's get_rope_index reads `config.audio_config.n_window`, which the talker config lacks):
the reference's talker is given the thinker's audio config, the one those audio rows were counted with."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.qwen3_omni_checkpoints import TALKERS, THINKERS, load_reference, write_tiny_thinker
from tests.parity.test_qwen3_omni_inputs import conversation, reference_inputs
from tests.parity.test_qwen3_omni_speech_codes import REPLY_TOKENS, TALKER_TOKENS, WAVE
from vidloom.core.chat import build_chat_request
from vidloom.core.speech import SpeechRequest
from vidloom.core.chat import SamplingParams
from vidloom.families.qwen3_omni.program import eos_ids
from vidloom.generator import VideoGenerator
from vidloom.media.audio_upload import load_input_audio
from vidloom.media.chat_video import load_chat_video
from vidloom.media.image import load_image

KINDS = [("audio",), ("image",), ("audio", "image")]


@pytest.fixture(scope="module", params=list(zip(THINKERS, TALKERS)), ids=lambda pair: pair[1].name)
def tiny(request, tmp_path_factory):
    torch.set_num_threads(1)
    folder = write_tiny_thinker(tmp_path_factory.mktemp(request.param[1].name), request.param[0],
                                talker=request.param[1])
    reference = load_reference(folder)
    reference.talker.config.audio_config = reference.config.thinker_config.audio_config  # see the module docstring
    return folder, reference, VideoGenerator.from_pretrained(str(folder), device="cpu")


def spoken(messages, max_tokens: int = REPLY_TOKENS) -> SpeechRequest:
    chat = build_chat_request(messages, load_image=load_image, load_audio=load_input_audio,
                              load_video=load_chat_video, max_tokens=max_tokens, temperature=0.0)
    return SpeechRequest(chat=chat, voice="chelsie", talker_sampling=SamplingParams(temperature=0.0),
                         max_audio_tokens=TALKER_TOKENS - 1)


def reference_speech(reference, inputs: dict, eos: list[int]):
    """generate(return_audio=True), greedy: (sequences, waveform, codes [frames, groups] as handed to code2wav)."""
    seen = []
    decode = reference.code2wav.chunked_decode
    reference.code2wav.chunked_decode = lambda codes, **kw: seen.append(codes) or decode(codes, **kw)
    try:
        with torch.inference_mode():
            sequences, wave = reference.generate(**inputs, return_audio=True, speaker="chelsie",
                                                 thinker_do_sample=False, talker_do_sample=False,
                                                 thinker_max_new_tokens=REPLY_TOKENS,
                                                 talker_max_new_tokens=TALKER_TOKENS, thinker_eos_token_id=eos)
    finally:
        reference.code2wav.chunked_decode = decode
    return sequences, wave, seen[0][0].T


@pytest.mark.parametrize("kinds", KINDS, ids="+".join)
def test_spoken_answer_with_media_equals_generate(tiny, kinds):
    folder, reference, gen = tiny
    tokenizer = gen.engine.instance["tokenizer"]
    messages, media = conversation(kinds, 1)
    out = gen.engine.submit(spoken(messages)).finish()
    sequences, wave, codes = reference_speech(reference, reference_inputs(folder, tokenizer, media),
                                              list(eos_ids(tokenizer)))
    assert list(out["thinker"].ids) == sequences[0].tolist()
    assert len(out["frames"]) >= 4 and torch.equal(out["frames"], codes), (out["frames"].shape, codes.shape)
    assert out["audio"].shape == wave[0, 0].shape and np.abs(out["audio"] - wave[0, 0].numpy()).max() <= WAVE
    assert gen.engine.decoder.stats()["kv_blocks_in_use"] == 0


def test_the_media_rows_and_their_positions_reach_the_talker(tiny):
    """Another image in the same prompt, or the image's talker rows at text positions, change the codes: the
    parity above is not reached with the media ignored."""
    from vidloom.families.qwen3_omni import speech_codes

    folder, reference, gen = tiny
    messages, _ = conversation(("image",), 1)
    codes = gen.engine.submit(spoken(messages)).finish()["frames"]
    other, _ = conversation(("image",), 2)
    assert not torch.equal(gen.engine.submit(spoken(other)).finish()["frames"], codes)
    plain = speech_codes.talker_positions
    try:
        speech_codes.talker_positions = lambda in_user, rows, media, s: plain(in_user, rows, None, s)
        flat = gen.engine.submit(spoken(messages)).finish()["frames"]
    finally:
        speech_codes.talker_positions = plain
    assert not torch.equal(flat, codes)


@pytest.mark.parametrize("sound", [False, True], ids=["video", "video+audio"])
def test_spoken_answer_to_a_video_equals_generate(tiny, sound):
    """A video part (with its sound track when use_audio_in_video): the talker reads its rows at the positions
    generate()'s talker gives them (speech_codes.talker_positions)."""
    from tests.helpers.chat_videos import video_bytes
    from tests.parity import test_qwen3_omni_video as video

    folder, reference, gen = tiny
    tokenizer = gen.engine.instance["tokenizer"]
    data = video_bytes(1, frames=9, size=(80, 64), fps=4, sound=sound)
    out = gen.engine.submit(spoken(video.conversation(data, sound))).finish()
    sequences, wave, codes = reference_speech(reference, video.reference_inputs(folder, tokenizer, data, sound),
                                              list(eos_ids(tokenizer)))
    assert list(out["thinker"].ids) == sequences[0].tolist()
    assert len(out["frames"]) >= 4 and torch.equal(out["frames"], codes), (out["frames"].shape, codes.shape)
    assert out["audio"].shape == wave[0, 0].shape and np.abs(out["audio"] - wave[0, 0].numpy()).max() <= WAVE
    assert gen.engine.decoder.stats()["kv_blocks_in_use"] == 0
