"""Streamed speech (audio_chunk_codes): audio leaves while the talker decodes, and matches the whole utterance.

The talker's codes are the non-streamed run's (the chunk decodes do not touch its state). Each chunk
is token2wav + vocoder on a block-aligned window around it (families.qwen_omni.stream_audio); against
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
from vidloom.families.qwen_omni import stream_audio

GREEDY = SamplingParams(temperature=0.0)
CODES, CHUNK, SEED = 24, 4, 7
TEXT = "the kite rose over the dunes"
EXACT_ATOL = 1e-5  # the same frames and noise through differently sized windows: summation order only
# Measured on both tiny configs (random weights, 9 RK4 intervals, chunks of 2, 4 and 8 codes): with the
# default context (2 DiT blocks back, 1 ahead, as the Qwen2.5-Omni report's sliding window) the chunked mel
# is within 3.4e-5 of the whole mel's full scale (|mel| <= ~3.8) on omni-b and 7e-8 on omni-a; the waveform
# within 4.2e-4 (omni-a, full scale 0.64): the vocoder's convolutions read a few mel frames past a window's
# one-block look-ahead, which the window cannot give it.
MEL_ATOL = 1e-4  # of the whole mel's largest magnitude
WAVE_ATOL = 1e-3


@pytest.fixture(scope="module", params=OMNI_CONFIGS, ids=lambda spec: spec.name)
def gen(request, tmp_path_factory):
    torch.set_num_threads(1)
    return VideoGenerator.from_pretrained(str(write_tiny_omni(tmp_path_factory.mktemp(request.param.name),
                                                               request.param)))


def speak(gen: VideoGenerator, chunk: int | None) -> tuple[dict, list]:
    events: list = []
    request = SpeechRequest(text=TEXT, voice="Chelsie", talker_sampling=GREEDY, seed=SEED, max_audio_tokens=CODES,
                            audio_chunk_codes=chunk)
    return gen.engine.submit(request, events.append).finish(), events


def open_stream(gen: VideoGenerator) -> stream_audio.AudioStream:
    dit, vocoder = gen.engine.instance["token2wav"]
    return stream_audio.open_stream(dit, vocoder, gen.engine.instance["speakers"]["Chelsie"], CODES, CHUNK, 10, SEED)


def whole_utterance(gen: VideoGenerator, codes: torch.Tensor) -> tuple[torch.Tensor, np.ndarray]:
    """The same codes decoded at once from the streamed request's noise (its first frames): (mel, samples)."""
    stream = open_stream(gen)
    noise = stream.noise[:, :codes.numel() * stream.dit.config.repeats]
    with torch.inference_mode():
        return stream_audio.decode_window(stream.dit, stream.vocoder, stream.voice, codes, noise, 10)


def streamed_mel(gen: VideoGenerator, codes: list[int]) -> torch.Tensor:
    """The chunks' mels, the codes arriving one at a time as the talker hands them over."""
    stream, pieces = open_stream(gen), []
    for n in range(1, len(codes) + 1):
        while stream.ready(n, n == len(codes)):
            piece = stream_audio.decode_chunk(**stream.plan_inputs(codes[:n], n == len(codes)))
            stream.add(piece)
            pieces.append(piece.mel)
    return torch.cat(pieces, dim=2)


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


def test_streamed_audio_within_tolerance_of_whole(gen):
    out, _ = speak(gen, CHUNK)
    mel, whole = whole_utterance(gen, out["codes"])
    assert len(whole) == len(out["audio"]) and float(np.abs(whole).max()) > 0.02
    np.testing.assert_allclose(out["audio"], whole, atol=WAVE_ATOL, rtol=0)
    # The mel is where the windows show (random vocoders barely move with their input).
    chunked = streamed_mel(gen, out["codes"].tolist())
    assert chunked.shape == mel.shape
    assert float((chunked - mel).abs().max()) <= MEL_ATOL * float(mel.abs().max())


def test_window_spanning_the_utterance_is_exact(gen, monkeypatch):
    monkeypatch.setattr(stream_audio, "LOOK_BACK_BLOCKS", CODES)
    monkeypatch.setattr(stream_audio, "LOOK_AHEAD_BLOCKS", CODES)
    out, events = speak(gen, CHUNK)
    assert sum(isinstance(e, AudioChunkEvent) for e in events) > 1
    mel, whole = whole_utterance(gen, out["codes"])
    np.testing.assert_allclose(out["audio"], whole, atol=EXACT_ATOL, rtol=0)
    chunked = streamed_mel(gen, out["codes"].tolist())
    torch.testing.assert_close(chunked, mel, atol=EXACT_ATOL, rtol=0)
