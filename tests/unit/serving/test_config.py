"""ServeConfig refuses settings the server could not run with, naming the setting."""

from __future__ import annotations

import pytest

from vidloom.serving.config import ServeConfig


@pytest.mark.parametrize(("setting", "value"), [
    ("policy", "lifo"), ("slots", 0), ("queue_size", 0), ("port", 70000), ("max_body_bytes", 0), ("cancel_wait_s", 0),
])
def test_bad_settings_name_themselves(setting, value):
    with pytest.raises(ValueError, match=setting):
        ServeConfig(**{setting: value})


def test_data_dir_becomes_a_path():
    assert ServeConfig(data_dir="somewhere").data_dir.name == "somewhere"
