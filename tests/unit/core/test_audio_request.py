"""Audio-only cards (ModelCard.audio): the seconds rules and the refused frame fields, without loading a model."""

from __future__ import annotations

import dataclasses

import pytest

from vidloom.core.card import AudioSpec
from vidloom.core.errors import InvalidCard, InvalidRequest
from vidloom.core.request import GenerationRequest, Task
from vidloom.media.request_inputs import resolve_request
from vidloom.families.stable_audio.cards import stable_audio_card
from vidloom.families.wan.demo import demo_card as wan_demo_card

SPEC = AudioSpec(max_seconds=2.0, default_seconds=2.0, min_start=0.0, max_end=2.0, sample_rate=100)
CARD = stable_audio_card("audio-test", "/nowhere", SPEC, description="test", precision="float32")


def _resolve(**fields) -> GenerationRequest:
    return resolve_request(GenerationRequest(prompt="rain", task=Task.T2A, **fields), CARD)


def test_defaults_fill_the_window_and_resolving_twice_is_the_same():
    once = _resolve()
    assert (once.option("seconds"), once.option("seconds_start")) == (2.0, 0.0)
    assert resolve_request(once, CARD) == once
    late = _resolve(seconds_start=1.5)
    assert late.option("seconds") == 0.5  # the default is cut to end within the window


@pytest.mark.parametrize("fields,name", [
    (dict(seconds=2.5), "seconds"), (dict(seconds=0), "seconds"), (dict(seconds=-1.0), "seconds"),
    (dict(seconds=float("inf")), "seconds"), (dict(seconds=True), "seconds"), (dict(seconds_start=-0.5), "seconds_start"),
    (dict(seconds_start=2.0, seconds=1.5), "seconds"), (dict(height=64), "height"), (dict(width=64), "width"),
    (dict(num_frames=5), "num_frames"), (dict(fps=8), "fps"),
    (dict(seconds=0.005), "seconds"),  # half a sample at 100 Hz: the clip would be empty
    (dict(seconds_start=2.0, seconds=0.5), "seconds"), (dict(seconds_start=1.9, seconds=0.5), "seconds"),
    (dict(flow_shift=3.0), "flow_shift"),  # the cosine DPM schedule has no shift: refused, not ignored
])
def test_bad_fields_name_themselves(fields, name):
    with pytest.raises(InvalidRequest) as info:
        _resolve(**fields)
    assert info.value.field == name


def test_a_video_task_is_refused_and_seconds_on_a_video_card_too():
    with pytest.raises(InvalidRequest) as info:
        resolve_request(GenerationRequest(prompt="rain"), CARD)  # the default task is text-to-video
    assert info.value.field == "task"
    for name in ("seconds", "seconds_start"):
        with pytest.raises(InvalidRequest) as info:
            resolve_request(GenerationRequest(prompt="rain", **{name: 1.0}), wan_demo_card())
        assert info.value.field == name


def test_every_accepted_clip_holds_the_samples_it_asked_for():
    """The clip the program cuts from the window is as long as asked (to the truncated sample), never empty."""
    for start, seconds in ((0.0, 0.01), (0.5, 1.5), (1.99, 0.01), (0.123, 0.877)):
        r = _resolve(seconds_start=start, seconds=seconds)
        first, end = SPEC.clip_samples(r.option("seconds_start"), r.option("seconds"))
        assert 0 <= first < end <= SPEC.max_seconds * SPEC.sample_rate
        assert abs((end - first) - seconds * SPEC.sample_rate) <= 1


def test_card_checks_its_audio_spec():
    with pytest.raises(InvalidCard, match="default_seconds"):
        dataclasses.replace(CARD, audio=dataclasses.replace(SPEC, default_seconds=3.0))
    with pytest.raises(InvalidCard, match="max_end"):
        dataclasses.replace(CARD, audio=dataclasses.replace(SPEC, max_end=3.0))
    with pytest.raises(InvalidCard, match="audio spec"):
        dataclasses.replace(CARD, produces_audio=False)
