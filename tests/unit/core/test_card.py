"""ModelCard validates itself when built."""

import dataclasses

import pytest

from vidloom.core.card import LoopSpec, ModelCard
from vidloom.core.errors import InvalidCard
from vidloom.core.request import Task
from vidloom.families.wan.demo import demo_card


def _fields(card: ModelCard, **changes) -> dict:
    base = {f.name: getattr(card, f.name) for f in dataclasses.fields(card)}
    base.update(changes)
    return base


def test_registered_demo_card_is_valid():
    card = demo_card()
    assert card.tasks == frozenset({Task.T2V, Task.V2V})
    assert card.inputs == {"video"} and card.option_names == ("strength",)
    assert card.samplers == ("unipc", "euler")
    assert card.notes and "RANDOM" in card.notes[0]


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"tasks": frozenset()}, "serves no task"),
        ({"precision": "int3"}, "precision"),
        ({"loops": {"other": LoopSpec(samplers=("unipc",))}}, "recipe assumes loop"),
        ({"program": "no_colon"}, "module:function"),
    ],
)
def test_inconsistent_cards_are_rejected(changes, message):
    with pytest.raises(InvalidCard, match=message):
        ModelCard(**_fields(demo_card(), **changes))


def test_default_sampler_must_exist():
    card = demo_card()
    bad = dataclasses.replace(card.sampling_defaults, sampler="ddim")
    with pytest.raises(InvalidCard, match="default sampler"):
        ModelCard(**_fields(card, sampling_defaults=bad))


def test_default_frames_must_follow_geometry():
    card = demo_card()
    bad = dataclasses.replace(card.sampling_defaults, num_frames=16)
    with pytest.raises(InvalidCard, match="4k\\+1"):
        ModelCard(**_fields(card, sampling_defaults=bad))


def test_card_is_immutable():
    card = demo_card()
    with pytest.raises(TypeError):
        card.components["x"] = None  # type: ignore[index]
