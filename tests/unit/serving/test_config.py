"""ServeConfig refuses settings the server could not run with, naming the setting."""

from __future__ import annotations

import pytest

from vidloom.serving.config import ServeConfig


@pytest.mark.parametrize(("setting", "value"), [
    ("policy", "lifo"), ("max_batch", 2), ("max_batch", 0), ("batch_wait_s", -1), ("slots", 0), ("queue_size", 0), ("port", 70000), ("max_body_bytes", 0), ("cancel_wait_s", 0),
    ("media_workers", 0), ("media_queue", -1),
])
def test_bad_settings_name_themselves(setting, value):
    with pytest.raises(ValueError, match=setting):
        ServeConfig(**{setting: value})


def test_data_dir_becomes_a_path():
    assert ServeConfig(data_dir="somewhere").data_dir.name == "somewhere"


@pytest.mark.parametrize(("setting", "value"), [
    ("max_pixels", 0), ("max_frames", 0), ("max_steps", -1), ("max_prompt_chars", 0), ("max_request_memory_bytes", 0),
    ("header_timeout_s", 0), ("body_timeout_s", -1), ("keep_alive_timeout_s", 0), ("max_connections", 0),
    ("sse_queue_size", 0), ("probe_connections", 0), ("health_port", 70000), ("health_port", 8000),
])
def test_bad_limits_name_themselves(setting, value):
    with pytest.raises(ValueError, match=setting):
        ServeConfig(**{setting: value})


def test_request_limits_derive_from_the_card_unless_set():
    from vidloom.core.limits import RequestLimits
    from vidloom.families.wan.demo import demo_card

    card = demo_card()
    derived = ServeConfig().request_limits(card, memory_budget=1 << 30)
    assert derived == RequestLimits.from_card(card, max_memory_bytes=1 << 30)
    set_here = ServeConfig(max_steps=12, max_request_memory_bytes=5 << 20).request_limits(card, memory_budget=1 << 30)
    assert set_here.max_steps == 12 and set_here.max_memory_bytes == 5 << 20
    assert set_here.max_pixels == derived.max_pixels
