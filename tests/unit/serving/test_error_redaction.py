"""Server error text (a failed run's 500, a session's error message) names no server path and no object address."""

from __future__ import annotations

from vidloom.serving.errors import redact_paths


def test_server_errors_lose_paths_and_object_addresses():
    text = "step failed on <torch.cuda.Stream object at 0x7f3a2b1c> reading /tmp/vidloom-upload-ab12/input.wav"
    assert redact_paths(text) == "step failed on reading input.wav"
