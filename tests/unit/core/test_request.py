"""GenerationRequest validation: every bad field raises InvalidRequest naming it."""

import dataclasses

import pytest

from vidloom.core.errors import InvalidRequest
from vidloom.core.request import GenerationRequest, Task
from vidloom.media.request_inputs import resolve_request
from vidloom.families.wan.demo import demo_card


@pytest.fixture(scope="module")
def card():
    return demo_card()


def test_defaults_fill_unset_fields(card):
    r = resolve_request(GenerationRequest(prompt="a cat"), card)
    d = card.sampling_defaults
    assert (r.height, r.width, r.num_frames, r.num_inference_steps) == (d.height, d.width, d.num_frames, d.num_inference_steps)
    assert r.sampler == d.sampler and r.flow_shift == d.flow_shift and r.guidance_scale == d.guidance_scale
    assert isinstance(r.seed, int) and r.seed >= 0


def test_explicit_fields_are_kept(card):
    r = resolve_request(GenerationRequest(prompt="a cat", height=32, width=48, num_frames=5, seed=7, sampler="euler"), card)
    assert (r.height, r.width, r.num_frames, r.seed, r.sampler) == (32, 48, 5, 7, "euler")


@pytest.mark.parametrize(
    "field, value",
    [
        ("prompt", ""),
        ("prompt", "   "),
        ("num_inference_steps", 0),
        ("num_inference_steps", -3),
        ("num_inference_steps", 2.5),
        ("height", 100),  # not divisible by 16
        ("width", 8),
        ("height", 0),
        ("num_frames", 16),  # not 4k+1
        ("num_frames", 0),
        ("guidance_scale", -1.0),
        ("guidance_scale", "5"),
        ("flow_shift", 0.0),
        ("sampler", "ddim"),
        ("seed", -1),
        ("fps", 0),
        ("task", Task.I2V),
        ("task", "nonsense"),
    ],
)
def test_invalid_fields_name_the_field(card, field, value):
    request = dataclasses.replace(GenerationRequest(prompt="a cat"), **{field: value})
    with pytest.raises(InvalidRequest) as info:
        resolve_request(request, card)
    assert info.value.field == field
    assert field in str(info.value)


def test_frame_error_says_what_works(card):
    with pytest.raises(InvalidRequest, match=r"4k\+1"):
        resolve_request(GenerationRequest(prompt="x", num_frames=8), card)


def test_cfg_only_when_guidance_amplifies():
    assert GenerationRequest(prompt="x", guidance_scale=5.0).uses_cfg
    assert not GenerationRequest(prompt="x", guidance_scale=1.0).uses_cfg
    assert not GenerationRequest(prompt="x", guidance_scale=0.0).uses_cfg


def _i2v_card():
    from vidloom.families.wan_causal.cards import far_card

    return far_card("far-test", "/nonexistent")


@pytest.mark.parametrize(
    ("image", "task", "match"),
    [
        (None, Task.I2V, "needs a conditioning image"),
        ("gray-float", Task.I2V, "finite values in \\[0, 1\\]"),
        ("bad-shape", Task.I2V, "HxW, HxWx3 or HxWx4"),
        ("two", Task.I2V, "more than the limit of 1"),
        ("two", Task.T2V, "more than the limit of 1"),
    ],
)
def test_image_field_is_checked(image, task, match):
    import numpy as np
    from PIL import Image

    rgb = Image.new("RGB", (48, 32))
    images = {
        "gray-float": np.full((32, 48), 2.0, np.float32),
        "bad-shape": np.zeros((32, 48, 5), np.uint8),
        "two": [rgb, rgb],
    }
    request = GenerationRequest(prompt="a cat", task=task, height=32, width=48, num_frames=5, image=images.get(image))
    with pytest.raises(InvalidRequest, match=match) as err:
        resolve_request(request, _i2v_card())
    assert err.value.field == "image"


def test_i2v_image_resolves_to_one_rgb_image_and_sets_the_task():
    import numpy as np

    array = np.zeros((40, 56, 3), np.uint8)  # any size: the recipe resizes it to the video
    r = resolve_request(GenerationRequest(prompt="a cat", height=32, width=48, image=array), _i2v_card())
    assert r.task == Task.I2V and len(r.image) == 1
    assert r.image[0].mode == "RGB" and r.image[0].size == (56, 40)
    assert "image" not in repr(r)  # pixels stay out of logs and comparisons


def test_image_task_is_refused_by_a_t2v_only_card(card):
    from PIL import Image

    image = (Image.new("RGB", (48, 32)),)
    with pytest.raises(InvalidRequest) as err:
        resolve_request(GenerationRequest(prompt="a cat", task=Task.I2V, height=32, width=48, image=image), card)
    assert err.value.field == "image" and "does not accept image" in err.value.message


@pytest.mark.parametrize(
    ("task", "frames", "match"),
    [(Task.V2V, None, "needs a conditioning video"), (Task.V2V, 4, "4k\\+1"), (Task.V2V, 5, None),
     (Task.T2V, 5, None)],  # a video given to a t2v request makes it v2v
)
def test_video_field_is_checked(task, frames, match):
    import numpy as np

    video = None if frames is None else np.zeros((frames, 32, 48, 3), np.uint8)
    request = GenerationRequest(prompt="a cat", task=task, height=32, width=48, num_frames=9, video=video)
    if match is None:
        resolved = resolve_request(request, _i2v_card())
        assert resolved.task == Task.V2V and len(resolved.video) == frames  # RGB PIL frames
        assert resolved.num_frames == 9  # a continuation: the output length is the request's, not the clip's
        return
    with pytest.raises(InvalidRequest, match=match) as err:
        resolve_request(request, _i2v_card())
    assert err.value.field == "video"


@pytest.mark.parametrize(
    "field, value",
    [
        ("flow_shift", 5e-324),  # 1 + (shift - 1) == 0: sigma_max would be inf and the job NaN
        ("flow_shift", 1e-300),
        ("flow_shift", 0.0099),
        ("flow_shift", 100.5),
        ("guidance_scale", 1e308),
        ("guidance_scale", 10**400),  # an int no float holds: a clear error, not OverflowError
        ("guidance_scale", float("nan")),
        ("step_cache_threshold", float("inf")),  # not JSON: it could not be stored or answered
        ("step_cache_threshold", 1e10),
        ("seed", 2**64),
        ("fps", 241),
    ],
    ids=lambda v: str(v)[:24],
)
def test_degenerate_numbers_are_refused(card, field, value):
    request = dataclasses.replace(GenerationRequest(prompt="a cat"), **{field: value})
    with pytest.raises(InvalidRequest) as info:
        resolve_request(request, card)
    assert info.value.field == field
    assert len(str(info.value)) < 200  # the value is quoted cut short


def test_flow_shift_range_ends_are_accepted(card):
    from vidloom.core.request import MAX_FLOW_SHIFT, MIN_FLOW_SHIFT

    for shift in (MIN_FLOW_SHIFT, MAX_FLOW_SHIFT):
        assert resolve_request(GenerationRequest(prompt="a cat", flow_shift=shift), card).flow_shift == shift


def test_huge_int_error_names_its_size_not_its_digits(card):
    request = GenerationRequest(prompt="a cat", seed=10**5000)  # repr() of it raises ValueError
    with pytest.raises(InvalidRequest, match="seed: must be at most .* an integer of 16610 bits"):
        resolve_request(request, card)


def test_options_arrive_as_keywords_and_survive_replace(card):
    request = GenerationRequest(prompt="p", strength=0.5, reason=False, camera=None)  # False / None: not given
    assert dict(request.options) == {"strength": 0.5} and request.option("camera") is None
    moved = dataclasses.replace(request, seed=3, strength=0.25)
    assert (moved.seed, moved.option("strength")) == (3, 0.25)
    assert request.with_options(strength=None).options == {}
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.options = {}  # type: ignore[misc]


def test_an_option_is_checked_by_kind_and_an_unknown_one_suggests_a_name(card):
    with pytest.raises(InvalidRequest) as bad:
        resolve_request(GenerationRequest(prompt="p", strength="half"), card)
    assert bad.value.field == "strength" and "must be a number" in bad.value.message
    with pytest.raises(InvalidRequest) as typo:
        resolve_request(GenerationRequest(prompt="p", num_frame=9), card)
    assert typo.value.field == "num_frame" and "did you mean num_frames?" in typo.value.message


def test_a_resolved_request_is_resolved_once_and_a_changed_one_again(card, monkeypatch):
    import vidloom.core.request as core_request

    resolved = resolve_request(GenerationRequest(prompt="p"), card)
    calls = []
    monkeypatch.setattr(core_request, "validate", lambda r, c: calls.append(r))
    assert resolve_request(resolved, card) is resolved and not calls
    changed = dataclasses.replace(resolved, seed=5)
    assert resolve_request(changed, card).seed == 5 and len(calls) == 1
    other = dataclasses.replace(card, model_id="other-card")
    resolve_request(resolved, other)
    assert len(calls) == 2  # another card checks it again


def test_a_request_pickles_with_its_options_and_without_its_mark(card):
    import pickle

    resolved = resolve_request(GenerationRequest(prompt="p", seed=4), card)
    marked = dataclasses.replace(resolved, strength=0.5)  # options need not be valid to travel
    back = pickle.loads(pickle.dumps(marked))
    assert back == marked and dict(back.options) == {"strength": 0.5}
    assert not hasattr(pickle.loads(pickle.dumps(resolved)), "_resolved_for")
