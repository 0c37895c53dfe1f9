"""The server's own limits at their exact boundaries: the limit itself is allowed, one past it is refused."""

from __future__ import annotations

import pytest

from vidloom.core.errors import InvalidRequest
from vidloom.families.wan.demo import demo_card
from vidloom.serving.params import parse_size, plan_video
from vidloom.serving.protocol import VideoCreateBody

CARD = demo_card()  # spatial multiple 16, frames 4k+1


def test_smallest_size_is_one_spatial_multiple():
    assert parse_size("16x16", CARD) == (16, 16)
    for size in ("0x16", "16x0"):
        with pytest.raises(InvalidRequest, match="size: width and height must be positive multiples of 16"):
            parse_size(size, CARD)


def test_max_frames_is_inclusive_and_names_the_field_the_client_sent():
    assert plan_video(VideoCreateBody(prompt="x", num_frames=9), CARD, max_frames=9).request.num_frames == 9
    with pytest.raises(InvalidRequest, match="num_frames: 13 frames is more than this server's limit of 9"):
        plan_video(VideoCreateBody(prompt="x", num_frames=13), CARD, max_frames=9)
    with pytest.raises(InvalidRequest, match="seconds: 17 frames is more than this server's limit of 9"):
        plan_video(VideoCreateBody(prompt="x", seconds="2", fps=8), CARD, max_frames=9)


def test_fps_of_one_is_allowed_and_zero_is_refused_naming_fps():
    assert plan_video(VideoCreateBody(prompt="x", fps=1, num_frames=5), CARD, max_frames=9).request.fps == 1
    with pytest.raises(InvalidRequest, match="fps: must be an integer >= 1, got 0"):
        plan_video(VideoCreateBody(prompt="x", fps=0), CARD, max_frames=9)
