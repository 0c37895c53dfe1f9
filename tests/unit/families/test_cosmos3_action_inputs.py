"""Bad action blocks: each refused at the boundary (resolve_request) with InvalidRequest naming the field.

The card is built as card_from_checkpoint builds it for a folder with an action pathway (width 10, eight
domains), so no weights are needed: the checks run before anything is loaded or queued.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from PIL import Image

from vidloom import ActionInput
from vidloom.core.errors import InvalidRequest
from vidloom.media.request_inputs import resolve_request
from vidloom.generator import build_request
from vidloom.families.cosmos3.cards import GENERATION_DEFAULTS, cosmos3_card

CARD = cosmos3_card("tiny-action", "/nowhere", generates=True, sound=False, defaults=GENERATION_DEFAULTS,
                    description="test", actions={"action_dim": 10, "domains": 8})
PLAIN = cosmos3_card("tiny", "/nowhere", generates=True, sound=False, defaults=GENERATION_DEFAULTS,
                     description="test")
IMAGE = Image.new("RGB", (64, 48), (10, 200, 30))
VIDEO = [IMAGE] * 5


def _resolve(card=CARD, **fields: Any):
    return resolve_request(build_request(card, "push the block", **fields), card)


def _refused(field: str, **fields: Any) -> str:
    with pytest.raises(InvalidRequest) as exc:
        _resolve(**fields)
    assert exc.value.field == field, exc.value
    return exc.value.message


def _policy(**kw: Any) -> ActionInput:
    return ActionInput(**{"mode": "policy", "domain_name": "pusht", "chunk_size": 4, "resolution_tier": 256, **kw})


def test_a_valid_block_sets_frames_and_size_from_the_input():
    request = _resolve(image=IMAGE, action=_policy(chunk_size=8))
    assert (request.num_frames, request.height, request.width) == (9, 48, 64)
    block = request.option("action")
    assert block.canvas == (256, 320) and block.raw_width == 2 and block.domain_id == 4
    forward = _resolve(image=IMAGE, action=_policy(mode="forward_dynamics", raw_actions=[[0.1, 0.2]] * 2))
    assert forward.option("action").raw_actions.shape == (4, 2)  # the last action repeated to the chunk
    assert np.allclose(forward.option("action").raw_actions[-1], [0.1, 0.2])
    big = _resolve(image=Image.new("RGB", (700, 500)), action=_policy())  # downscaled into the 256 tier's canvas
    assert big.option("action").canvas == (256, 320) and (big.height, big.width) == (224, 320)


def test_the_block_is_refused_by_a_card_without_an_action_pathway():
    with pytest.raises(InvalidRequest) as exc:
        _resolve(PLAIN, image=IMAGE, action=_policy())
    assert exc.value.field == "action"


def test_domains():
    message = _refused("action.domain_name", image=IMAGE, action=_policy(domain_name="spaceship"))
    assert "pusht" in message and "bridge_orig_lerobot" in message and "galbot" not in message  # known here
    assert "30 wide" in _refused("action.domain_name", image=IMAGE, action=_policy(domain_name="galbot"))
    assert "domain 20" in _refused("action.domain_name", image=IMAGE, action=_policy(domain_name="fractal"))
    assert "width" in _refused("action.domain_name", image=IMAGE, action=_policy(domain_name="libero"))


def test_raw_actions():
    forward = dict(mode="forward_dynamics")
    assert "needs" in _refused("action.raw_actions", image=IMAGE, action=_policy(**forward))
    assert "2 wide" in _refused("action.raw_actions", image=IMAGE,
                                action=_policy(**forward, raw_actions=np.zeros((4, 3))))
    _refused("action.raw_actions", image=IMAGE, action=_policy(**forward, raw_actions=np.zeros(4)))
    _refused("action.raw_actions", image=IMAGE, action=_policy(**forward, raw_actions=np.zeros((0, 2))))
    _refused("action.raw_actions", image=IMAGE, action=_policy(**forward, raw_actions=[[1.0, float("nan")]]))
    _refused("action.raw_actions", image=IMAGE, action=_policy(**forward, raw_actions=[["a", "b"]]))
    _refused("action.raw_actions", image=IMAGE, action=_policy(raw_actions=np.zeros((4, 2))))  # policy predicts


@pytest.mark.parametrize("field, value", [("mode", []), ("domain_name", ["pusht"]), ("view_point", {}),
                                          ("resolution_tier", [256]), ("mode", 10**400), ("chunk_size", 10**400)],
                         ids=["mode-list", "domain-list", "view-dict", "tier-list", "mode-huge", "chunk-huge"])
def test_unhashable_or_huge_block_values_are_refused_naming_the_field(field, value):
    """A list was a TypeError (unhashable, in the `in` check) and 10**400 had no repr: both 500s."""
    message = _refused(f"action.{field}", image=IMAGE, action=_policy(**{field: value}))
    assert len(message) < 400


def test_mode_and_media_combinations():
    _refused("action.mode", image=IMAGE, action=_policy(mode="teleport"))
    assert "video" in _refused("video", image=IMAGE, action=_policy(mode="inverse_dynamics"))
    _refused("video", image=IMAGE, video=VIDEO, action=_policy())
    _refused("image", action=_policy())
    _refused("image", image=Image.new("RGB", (8, 64)), action=_policy())
    _refused("image", image=[IMAGE, IMAGE], action=_policy())
    assert _resolve(video=VIDEO, action=_policy(mode="inverse_dynamics")).option("action").mode == "inverse_dynamics"


def test_fields_the_block_decides_and_other_block_fields():
    _refused("num_frames", image=IMAGE, num_frames=9, action=_policy())
    _refused("height", image=IMAGE, height=32, action=_policy())
    _refused("action.chunk_size", image=IMAGE, action=_policy(chunk_size=5))
    _refused("action.chunk_size", image=IMAGE, action=_policy(chunk_size=0))
    _refused("action.chunk_size", image=IMAGE, action=_policy(chunk_size="8"))
    _refused("action.view_point", image=IMAGE, action=_policy(view_point="bird"))
    _refused("action.resolution_tier", image=IMAGE, action=_policy(resolution_tier=300))
    _refused("reason", image=IMAGE, reason=True, action=_policy())
    _refused("action", image=IMAGE, action={"mode": "policy"})
