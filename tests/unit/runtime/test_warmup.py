"""Warm-up requests (runtime.warmup): each is one the card's own request check accepts, with the shape it names, for
cards with and without a first frame; before, an image-to-video card's warm-up asked for text to image and failed."""

from __future__ import annotations

import numpy as np
import pytest

from vidloom.core.card import SamplingDefaults
from vidloom.core.request import Task
from vidloom.families.hunyuan15.cards import hunyuan15_card
from vidloom.families.qwen_image.cards import DEFAULTS as QWEN_DEFAULTS, qwen_image_card
from vidloom.families.wan.registered import wan21_flf2v_14b_720p, wan21_i2v_14b_480p
from vidloom.media.request_inputs import resolve_request
from vidloom.runtime.warmup import GRAY, warmup_request

HUNYUAN_DEFAULTS = SamplingDefaults(height=48, width=80, num_frames=121, fps=24, num_inference_steps=50,
                                    guidance_scale=6.0, flow_shift=5.0, sampler="euler", negative_prompt="")


def _hunyuan15(i2v: bool | None):
    return hunyuan15_card("hy", "/nowhere", multiple=16, temporal=4, defaults=HUNYUAN_DEFAULTS, description="",
                          i2v=i2v)


@pytest.mark.parametrize("i2v", [False, None], ids=["t2v", "t2v-and-i2v"])
def test_a_text_to_video_card_warms_text_to_video_at_the_shape(i2v):
    card = _hunyuan15(i2v)
    request = resolve_request(warmup_request(card, (32, 48, 5), steps=2, guidance=1.0), card)
    assert request.task is Task.T2V and not request.image
    assert (request.height, request.width, request.num_frames, request.num_inference_steps) == (32, 48, 5, 2)
    assert request.guidance_scale == 1.0


def test_an_image_to_video_card_whose_frame_sets_the_size_gets_a_gray_frame_of_the_shape():
    card = _hunyuan15(True)  # takes no height and width: the frame's aspect bucket is the size
    raw = warmup_request(card, (80, 45, 5), steps=2)
    assert raw.height is None and raw.width is None
    request = resolve_request(raw, card)
    assert request.task is Task.I2V and request.num_frames == 5
    (frame,) = request.image
    assert frame.size == (45, 80) and np.all(np.asarray(frame) == GRAY)


def test_an_edit_card_warms_text_to_image_with_its_reference_at_the_shape():
    card = qwen_image_card("edit", "/nowhere", multiple=16, defaults=QWEN_DEFAULTS, description="", edit=1)
    request = resolve_request(warmup_request(card, (32, 48, 1), steps=2), card)
    assert request.task is Task.T2I and (request.height, request.width) == (32, 48)
    assert request.image[0].size == (48, 32)


@pytest.mark.parametrize("card", [wan21_i2v_14b_480p(), wan21_flf2v_14b_720p()], ids=["i2v", "flf2v"])
def test_a_wan_first_frame_card_warms_image_to_video_at_the_shape(card):
    request = resolve_request(warmup_request(card, (32, 48, 5), steps=2), card)
    assert request.task is Task.I2V and (request.height, request.width, request.num_frames) == (32, 48, 5)
    assert request.image[0].size == (48, 32)
    assert (request.last_image is not None) == ("last_image" in card.required_inputs)
