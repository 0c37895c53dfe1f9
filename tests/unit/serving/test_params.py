"""API bodies -> GenerationRequest: the frame rule, size parsing, and which field an error names."""

from __future__ import annotations

import pytest

from vidloom.core.errors import InvalidRequest, UnknownModel
from vidloom.core.request import Task
from vidloom.families.wan.demo import demo_card
from vidloom.serving.params import api_field, choose_frames, format_seconds, parse_size, plan_images, plan_video
from vidloom.serving.protocol import ImageGenerationBody, VideoCreateBody

CARD = demo_card()  # 8 fps, 17 frames, 192x128 by default; frames must be 4k+1


@pytest.mark.parametrize(("seconds", "fps", "frames"), [
    (1, 8, 9),  # 8 frames -> nearest 4k+1 is 9
    (0.5, 8, 5),  # 4 -> 5
    (0.375, 8, 5),  # 3 is halfway between 1 and 5: ties go to the longer clip
    (0.25, 8, 1),  # 2 -> 1
    (0.01, 8, 1),  # rounds to 0 frames: at least one
    (5, 16, 81),  # Wan's usual 81 frames at 16 fps
    ("4", 8, 33),  # the openai client sends strings
])
def test_seconds_snap_to_the_nearest_valid_frame_count(seconds, fps, frames):
    assert choose_frames(VideoCreateBody(prompt="x", seconds=seconds), CARD, fps) == frames


def test_num_frames_wins_and_defaults_fill_the_rest():
    assert choose_frames(VideoCreateBody(prompt="x", seconds="4", num_frames=5), CARD, 8) == 5
    assert choose_frames(VideoCreateBody(prompt="x"), CARD, 8) == 17


@pytest.mark.parametrize("seconds", ["0", "-2", "nan", "inf", "soon", 1e308])
def test_bad_seconds_name_the_field(seconds):
    with pytest.raises(InvalidRequest) as excinfo:
        choose_frames(VideoCreateBody(prompt="x", seconds=seconds), CARD, 8)
    assert excinfo.value.field == "seconds"


@pytest.mark.parametrize("fps", [10**400, 241, 0, -1])
def test_fps_is_checked_before_it_multiplies_seconds(fps):
    # 10**400 has no float: seconds * fps raised OverflowError, a 500 on the server.
    for body in (VideoCreateBody(prompt="x", seconds="2", fps=fps), VideoCreateBody(prompt="x", fps=fps)):
        with pytest.raises(InvalidRequest) as excinfo:
            plan_video(body, CARD, max_frames=17)
        assert excinfo.value.field == "fps" and len(str(excinfo.value)) < 200


def test_plan_video_reports_size_and_actual_seconds():
    planned = plan_video(VideoCreateBody(prompt="x", size="48x32", seconds="1"), CARD, max_frames=100)
    r = planned.request
    assert (r.width, r.height, r.num_frames, r.fps, r.task) == (48, 32, 9, 8, Task.T2V)
    assert planned.size == "48x32" and planned.seconds == "1.125"
    assert r.request_id.startswith("video_") and r.seed is None  # resolve_request draws it later
    default = plan_video(VideoCreateBody(prompt="x"), CARD, max_frames=100)
    assert default.size == "192x128" and default.seconds == "2.125"


def test_plan_video_limits_frames():
    with pytest.raises(InvalidRequest) as excinfo:
        plan_video(VideoCreateBody(prompt="x", seconds=100), CARD, max_frames=81)
    assert excinfo.value.field == "seconds"
    with pytest.raises(InvalidRequest) as excinfo:
        plan_video(VideoCreateBody(prompt="x", num_frames=85), CARD, max_frames=81)
    assert excinfo.value.field == "num_frames"


@pytest.mark.parametrize("size", ["48", "48x", "x32", "48x32x1", "-48x32", "47x32", "48x40", "0x0", "a x b"])
def test_bad_sizes_name_size(size):
    with pytest.raises(InvalidRequest) as excinfo:
        parse_size(size, CARD)
    assert excinfo.value.field == "size"


def test_size_is_width_by_height():
    assert parse_size("832x480", CARD) == (832, 480)
    assert parse_size(None, CARD) == (192, 128)


def test_other_models_are_unknown():
    with pytest.raises(UnknownModel):
        plan_video(VideoCreateBody(prompt="x", model="sora-2"), CARD, max_frames=100)
    plan_video(VideoCreateBody(prompt="x", model="wan2.1-demo"), CARD, max_frames=100)


def test_images_are_one_frame_videos():
    planned = plan_images(ImageGenerationBody(prompt="x", size="64x48", seed=3, n=3, output_format="webp"), CARD)
    r = planned.requests[0]
    assert (r.num_frames, r.width, r.height, r.seed, r.task) == (1, 64, 48, 3, Task.T2V)
    assert [q.seed for q in planned.requests] == [3, 4, 5]  # n images, consecutive seeds
    assert (planned.response_format, planned.output_format, planned.size) == ("b64_json", "webp", "64x48")
    for field, value in (("n", 0), ("n", 11), ("response_format", "svg"), ("output_format", "gif")):
        with pytest.raises(InvalidRequest) as excinfo:
            plan_images(ImageGenerationBody(prompt="x", **{field: value}), CARD)
        assert excinfo.value.field == field


def test_api_field_names_and_seconds_format():
    assert api_field("height") == api_field("width") == "size"
    assert api_field("num_frames") == "num_frames"
    assert [format_seconds(f, fps) for f, fps in ((33, 8), (32, 8), (81, 16), (1, 3))] == ["4.125", "4", "5.062", "0.333"]


@pytest.mark.parametrize("size", ["\uff16\uff14x48", " 64 x 48", "64x48 ", "64x48\n", "64×48", "1" * 5000 + "x48", "64x"])
def test_size_takes_only_ascii_width_x_height(size):
    with pytest.raises(InvalidRequest) as info:
        parse_size(size, CARD)
    assert info.value.field == "size"


def test_size_accepts_either_x():
    assert parse_size("64X48", CARD) == parse_size("64x48", CARD) == (64, 48)
