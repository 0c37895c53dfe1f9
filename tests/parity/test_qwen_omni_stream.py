"""Streamed speech (audio_chunk_codes): audio leaves while the talker decodes, and matches the whole utterance.

The talker's codes are the non-streamed run's (the chunk decodes do not touch its state). Each chunk
is token2wav + vocoder on a block-aligned window around it (recipes.qwen_omni.stream_audio); against
the whole-utterance decode of the same codes from the same noise: equal (float32, up to summation
order) when the window spans the utterance, and within STREAM_ATOL with the default context.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.qwen_omni_checkpoints import OMNI_CONFIGS, write_tiny_omni
from vidloom.core.chat import SamplingParams
from vidloom.core.output import AudioChunkEvent, ProgressEvent
from vidloom.core.speech import SpeechRequest
from vidloom.generator import VideoGenerator
from vidloom.recipes.qwen_omni import stream_audio
from vidloom.recipes.qwen_omni.speech import start_speech

GREEDY = SamplingParams(temperature=0.0)
CODES, CHUNK, SEED = 24, 4, 7
TEXT = "the kite rose over the dunes"
EXACT_ATOL = 1e-5  # the same frames and noise through differently sized batches: summation order only
# Measured on both tiny configs (random weights, 9 RK4 intervals): the largest difference a chunk boundary
# leaves is below 2e-3 of full scale; the whole waveform spans about [-0.2, 0.2].
STREAM_ATOL = 5e-3


@pytest.fixture(scope="module", params=OMNI_CONFIGS, ids=lambda spec: spec.name)
def gen(request, tmp_path_factory):
    torch.set_num_threads(1)
    return VideoGenerator.from_pretrained(str(write_tiny_omni(tmp_path_factory.mktemp(request.param.name),
                                                               request.param)))


def speak(gen: VideoGenerator, chunk: int | None) -> tuple[dict, list]:
    events: list = []
    request = SpeechRequest(text=TEXT, voice="Chelsie", talker_sampling=GREEDY, seed=SEED, max_audio_tokens=CODES,
                            audio_chunk_codes=chunk)
    run = start_speech(gen.engine, request, events.append)
    try:
        while not run.step():
            pass
        return run.outputs(), events
    finally:
        run.close()


def whole_utterance(gen: VideoGenerator, codes: torch.Tensor) -> np.ndarray:
    """The same codes decoded at once from the streamed request's noise (its first frames)."""
    dit, vocoder = gen.engine.instance["token2wav"]
    voice = gen.engine.instance["speakers"]["Chelsie"]
    stream = stream_audio.open_stream(dit, vocoder, voice, CODES, CHUNK, 10, SEED)
    with torch.inference_mode():
        return stream_audio.decode_window(dit, vocoder, voice, codes, stream.noise[:, :codes.numel() * dit.config.repeats],
                                          10)


def test_first_audio_leaves_before_the_talker_finishes(gen):
    out, events = speak(gen, CHUNK)
    plain, _ = speak(gen, None)
    assert out["codes"].tolist() == plain["codes"].tolist() and out["codes"].numel() > 2 * CHUNK
    chunks = [i for i, e in enumerate(events) if isinstance(e, AudioChunkEvent)]
    talker_steps = [i for i, e in enumerate(events) if isinstance(e, ProgressEvent) and e.phase == "talker"]
    assert chunks[0] < talker_steps[-1]  # ordering, not timing: a chunk was out while codes were still coming
    pieces = [events[i] for i in chunks]
    assert [p.index for p in pieces] == list(range(len(pieces)))
    starts = np.cumsum([0] + [len(p.audio) for p in pieces[:-1]]).tolist()
    assert [p.start_sample for p in pieces] == starts
    np.testing.assert_array_equal(np.concatenate([p.audio for p in pieces]), out["audio"])
    assert len(out["audio"]) == len(plain["audio"])
    assert gen.engine.decoder.stats()["kv_blocks_in_use"] == 0


def test_streamed_waveform_within_tolerance_of_whole(gen):
    out, _ = speak(gen, CHUNK)
    whole = whole_utterance(gen, out["codes"])
    assert len(whole) == len(out["audio"]) and float(np.abs(whole).max()) > 0.02
    np.testing.assert_allclose(out["audio"], whole, atol=STREAM_ATOL, rtol=0)


def test_window_spanning_the_utterance_is_exact(gen, monkeypatch):
    monkeypatch.setattr(stream_audio, "LOOK_BACK_BLOCKS", CODES)
    monkeypatch.setattr(stream_audio, "LOOK_AHEAD_BLOCKS", CODES)
    out, events = speak(gen, CHUNK)
    assert sum(isinstance(e, AudioChunkEvent) for e in events) > 1
    np.testing.assert_allclose(out["audio"], whole_utterance(gen, out["codes"]), atol=EXACT_ATOL, rtol=0)
