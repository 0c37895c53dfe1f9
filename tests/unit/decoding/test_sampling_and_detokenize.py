"""Token sampling (greedy, temperature, top-k, top-p, seeded) and incremental detokenization with stop strings."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.cosmos3_checkpoints import train_tokenizer
from vidloom.core.chat import SamplingParams
from vidloom.decoding.detokenize import Detokenizer
from vidloom.decoding.sampling import make_generator, next_token

LOGITS = torch.tensor([1.0, 3.0, 2.9, -1.0, 0.5])


def _draws(params: SamplingParams, n: int = 300) -> list[int]:
    generator = make_generator(params)
    return [next_token(LOGITS, params, generator) for _ in range(n)]


def test_greedy_and_degenerate_sampling_pick_the_argmax():
    assert make_generator(SamplingParams(temperature=0)) is None
    assert next_token(LOGITS, SamplingParams(temperature=0), None) == 1
    assert set(_draws(SamplingParams(top_k=1, seed=0))) == {1}
    assert set(_draws(SamplingParams(top_p=0.01, seed=0))) == {1}


def test_top_k_and_top_p_restrict_the_candidates():
    assert set(_draws(SamplingParams(top_k=2, seed=0))) == {1, 2}
    # p(1) ~ 0.45, p(2) ~ 0.41: 0.8 needs both, 0.3 only the first
    assert set(_draws(SamplingParams(top_p=0.8, seed=0))) == {1, 2}
    assert set(_draws(SamplingParams(top_p=0.3, seed=0))) == {1}
    assert len(set(_draws(SamplingParams(seed=0)))) == 5  # no restriction: every token shows up


def test_temperature_sharpens_and_seed_reproduces():
    cold = _draws(SamplingParams(temperature=0.1, seed=1))
    assert cold.count(1) > 0.55 * len(cold)  # 3.0 vs 2.9 at T=0.1: e^1 more likely
    hot = _draws(SamplingParams(temperature=2.0, seed=1))
    assert hot.count(1) < 0.45 * len(hot)
    assert _draws(SamplingParams(seed=5)) == _draws(SamplingParams(seed=5))
    assert _draws(SamplingParams(seed=5)) != _draws(SamplingParams(seed=6))


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer()


def test_detokenizer_streams_the_whole_text(tokenizer):
    text = "the quick brown fox jumps"
    detok = Detokenizer(tokenizer)
    pieces = [detok.add(i) for i in tokenizer.encode(text)]
    assert "".join(pieces) + detok.flush() == text == detok.text
    assert detok.add(len(tokenizer) + 3) == ""  # a padded-vocab id has no text


def test_detokenizer_holds_back_a_partial_character(tokenizer):
    ids = tokenizer.encode("a é")  # byte-level BPE: é is two byte tokens here
    detok = Detokenizer(tokenizer)
    pieces = [detok.add(i) for i in ids]
    assert "\ufffd" not in "".join(pieces)
    assert "".join(pieces) + detok.flush() == "a é"


def test_stop_string_across_tokens_is_cut_and_never_streamed(tokenizer):
    detok = Detokenizer(tokenizer, stop=("brown fox",))
    pieces = []
    for i in tokenizer.encode("the quick brown fox jumps"):
        pieces.append(detok.add(i))
        if detok.stopped:
            break
    assert detok.stopped and detok.text == "the quick "
    assert "".join(pieces) + detok.flush() == "the quick "
    assert all("brown" not in p for p in pieces)


def test_a_stop_prefix_that_does_not_complete_is_released(tokenizer):
    detok = Detokenizer(tokenizer, stop=("quick red",))
    pieces = [detok.add(i) for i in tokenizer.encode("the quick brown")]
    assert not detok.stopped
    assert "".join(pieces) + detok.flush() == "the quick brown"


@pytest.mark.parametrize("temperature", [5e-324, 1e-300, 1e-38, 9.9e-6])
def test_temperatures_below_the_floor_decode_greedily(temperature: float):
    # Dividing logits by 5e-324 (0 in float32) gave inf/NaN probabilities and a 500.
    params = SamplingParams(temperature=temperature, seed=0)
    params.validate()
    assert params.greedy and make_generator(params) is None
    assert next_token(LOGITS, params, make_generator(params)) == 1


def test_the_temperature_floor_itself_samples():
    from vidloom.core.chat import MIN_TEMPERATURE

    params = SamplingParams(temperature=MIN_TEMPERATURE, seed=0)
    assert not params.greedy
    assert set(_draws(params, 50)) == {1}  # a finite distribution, all its mass on the top token
