"""Property tests (hypothesis) for the parsers of user values: SANA-WM camera strings, c2w poses and intrinsics,
Cosmos3 action blocks and OpenAI voices. Any input parses or raises InvalidRequest naming the field; nothing
else escapes (a TypeError, OverflowError or RecursionError would be a 500 on the server)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from vidloom import ActionInput
from vidloom.core.errors import InvalidRequest
from vidloom.core.speech import voice_from_openai
from vidloom.families.cosmos3.cards import GENERATION_DEFAULTS, cosmos3_card
from vidloom.families.qwen_omni.speakers import pick_voice
from vidloom.families.sana_wm.camera import CameraInput
from vidloom.generator import build_request
from vidloom.media.request_inputs import resolve_request

PROPERTY = settings(derandomize=True, database=None, deadline=None, max_examples=200)

NUMBERS = st.one_of(st.integers(-5, 20), st.integers(), st.floats(),
                    st.sampled_from([5e-324, 1e-300, 1e38, 1e300, 10**400, 2**64, -0.0, math.nan, math.inf]))
TEXT = st.one_of(st.text(max_size=10), st.sampled_from(["", "\x00", "\ud800", "nan", "1e400", "²", "٣", "9" * 400]))
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, TEXT)
JSON_VALUES = st.recursive(SCALARS,
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=3),
                           max_leaves=12)


def _deep(depth: int) -> Any:
    value: Any = 1.0
    for _ in range(depth):
        value = [value]
    return value


def _named(field: str | tuple[str, ...], call, *args: Any, **kwargs: Any) -> Any:
    """`call` returns, or raises InvalidRequest whose field is (one of) `field`."""
    try:
        return call(*args, **kwargs)
    except InvalidRequest as exc:
        assert exc.field in ((field,) if isinstance(field, str) else field), (exc.field, exc.message)
        return None


# -- SANA-WM camera -------------------------------------------------------------------------------------------------

SEGMENT = st.tuples(st.one_of(st.text("wasdijklWASDIJKL", max_size=4), st.just("none"), st.text(max_size=3)),
                    st.sampled_from(["-", "--", "", "－"]),
                    st.one_of(st.integers(-2, 12000).map(str), st.text("0123456789²٣.e+- ", max_size=8),
                              st.sampled_from(["9" * 5000, "0" * 50 + "3", "99999", "1e3"])))
ACTION_STRINGS = st.one_of(
    st.lists(SEGMENT.map("".join), max_size=5).map(lambda parts: st.sampled_from([",", "，", " , "]).map(
        lambda sep: sep.join(parts))).flatmap(lambda s: s),
    TEXT,
)
INTRINSICS = st.one_of(st.lists(NUMBERS, min_size=4, max_size=4), st.just([100.0, 100.0, 48.0, 32.0]),
                       st.lists(st.lists(NUMBERS, min_size=4, max_size=4), max_size=3), JSON_VALUES)
POSE = np.eye(4).tolist()
C2W = st.one_of(
    st.lists(st.just(POSE), min_size=1, max_size=3),
    st.lists(st.lists(st.lists(NUMBERS, min_size=4, max_size=4), min_size=4, max_size=4), max_size=2),
    st.builds(lambda i, j, value: [[[value if (r, c) == (i, j) else x for c, x in enumerate(row)]
                                    for r, row in enumerate(POSE)]], st.integers(0, 3), st.integers(0, 3), NUMBERS),
    st.sampled_from([_deep(10_000), _deep(40), [[[10**400] * 4] * 4], "eye", {"a": 1}, [], [[]], [[[]]]]),
    JSON_VALUES,
)


@PROPERTY
@given(action=st.one_of(ACTION_STRINGS, JSON_VALUES), intrinsics=INTRINSICS)
def test_any_camera_string_parses_or_names_its_field(action, intrinsics):
    camera = _named(("camera", "intrinsics"), CameraInput.build, action=action, intrinsics=intrinsics)
    if camera is not None:  # accepted: the poses it expands to are finite, one per counted frame
        poses = camera.poses()
        assert poses.ndim == 3 and poses.shape[1:] == (4, 4) and np.isfinite(poses).all()


@PROPERTY
@given(c2w=C2W, intrinsics=INTRINSICS)
def test_any_c2w_and_intrinsics_parse_or_name_their_field(c2w, intrinsics):
    # c2w None: "camera" (give one of the two)
    camera = _named(("c2w", "camera", "intrinsics"), CameraInput.build, c2w=c2w, intrinsics=intrinsics)
    if camera is not None:
        assert np.isfinite(camera.c2w).all() and np.isfinite(camera.intrinsics).all()


# -- Cosmos3 action blocks ------------------------------------------------------------------------------------------

ACTION_CARD = cosmos3_card("tiny-action", "/nowhere", generates=True, sound=False, defaults=GENERATION_DEFAULTS,
                           description="test", actions={"action_dim": 10, "domains": 8})
FIRST = Image.new("RGB", (64, 48), (10, 200, 30))
RAW_ACTIONS = st.one_of(
    st.none(), st.lists(st.lists(NUMBERS, min_size=2, max_size=2), max_size=5),
    st.sampled_from([[[0.5, -1.0]] * 4, [[10**400, 0.0]], _deep(5_000), [[1.0, "x"]], [[True, False]], [[]]]),
    JSON_VALUES,
)


@PROPERTY
@given(mode=st.one_of(st.sampled_from(["policy", "forward_dynamics", "inverse_dynamics"]), JSON_VALUES),
       domain=st.one_of(st.sampled_from(["pusht", "av", "bridge_orig_lerobot", "nope"]), JSON_VALUES),
       chunk=st.one_of(st.sampled_from([4, 8, 5, 0, -4, 2**64, 10**400]), JSON_VALUES),
       view=st.one_of(st.just("ego_view"), JSON_VALUES), tier=st.one_of(st.sampled_from([256, 480, 1]), JSON_VALUES),
       raw=RAW_ACTIONS)
def test_any_action_block_resolves_or_names_its_field(mode, domain, chunk, view, tier, raw):
    block = ActionInput(mode=mode, domain_name=domain, raw_actions=raw, chunk_size=chunk, view_point=view,
                        resolution_tier=tier)
    fields = ("action", "action.mode", "action.domain_name", "action.chunk_size", "action.view_point",
              "action.resolution_tier", "action.raw_actions", "image", "video")
    request = build_request(ACTION_CARD, "push the block", image=FIRST, action=block)
    _named(fields, resolve_request, request, ACTION_CARD)


# -- voices ---------------------------------------------------------------------------------------------------------

@PROPERTY
@given(voice=st.one_of(JSON_VALUES,
                       st.dictionaries(st.sampled_from(["id", "name", "\ud800"]), JSON_VALUES, max_size=2)))
def test_any_voice_value_is_a_name_or_names_the_field(voice):
    """OpenAI's `voice` field, then the speaker table's lookup of the name."""
    parsed = _named("voice", voice_from_openai, voice, "voice")
    assert parsed is None or isinstance(parsed, str)
    if parsed is not None or voice is None:
        picked = _named("voice", pick_voice, {"Chelsie": 0, "Ethan": 1}, parsed)
        assert picked in (None, 0, 1)
