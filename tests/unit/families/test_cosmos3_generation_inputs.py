"""Bad input to Cosmos3 generation: each refused with InvalidRequest naming the field, before any work."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from vidloom.core.errors import InvalidRequest
from vidloom.generator import VideoGenerator


def test_sound_refused_without_an_audio_tokenizer(cosmos3_dir: Path):
    generator = VideoGenerator.from_pretrained(cosmos3_dir, device="cpu")
    assert not generator.card.produces_audio
    with pytest.raises(InvalidRequest) as exc:
        generator.generate("a dog", sound=True, num_frames=5, height=32, width=32)
    assert exc.value.field == "sound"
    with pytest.raises(InvalidRequest) as exc:
        generator.generate("a dog", num_frames=6, height=32, width=32)  # frames the VAE cannot take
    assert exc.value.field == "num_frames"
    with pytest.raises(InvalidRequest) as exc:
        generator.generate("a dog", num_frames=5, height=40, width=32)  # not a multiple of 16
    assert exc.value.field == "height"
    with pytest.raises(InvalidRequest) as exc:
        generator.generate("a dog", num_frames=5, height=32, width=32, image=np.zeros((32, 32, 3), np.uint8),
                           video=[np.zeros((32, 32, 3), np.uint8)] * 5)
    assert exc.value.field in ("video", "image")


def test_an_image_request_with_a_first_frame_is_refused_before_reasoning(cosmos3_dir: Path):
    generator = VideoGenerator.from_pretrained(cosmos3_dir, device="cpu")
    events: list = []
    with pytest.raises(InvalidRequest) as exc:
        generator.generate("a dog", num_frames=1, height=32, width=32, reason=True,
                           image=np.zeros((32, 32, 3), np.uint8), on_event=events.append)
    assert exc.value.field == "image"
    assert not [e for e in events if getattr(e, "phase", None) == "reason"]
