"""Chat video parts checked at the boundary: limits by name, frames sampled as transformers' video processor picks
them, and a model without video placeholders refusing the part by its index (#38)."""

from __future__ import annotations

import pytest

from tests.helpers.chat_videos import video_bytes, video_part
from vidloom.core.chat import messages_from_openai
from vidloom.core.errors import InvalidRequest, LimitExceeded
from vidloom.media import chat_video
from vidloom.media.chat_video import load_chat_video
from vidloom.models.omni_video import sample_indices


def test_a_video_past_the_duration_limit_names_it(monkeypatch):
    data = video_bytes(1, frames=12, fps=4)  # 3 s
    assert load_chat_video(data, "v").frame_count == 12
    monkeypatch.setattr(chat_video, "MAX_CHAT_VIDEO_SECONDS", 2.5)
    with pytest.raises(LimitExceeded) as err:
        load_chat_video(data, "messages[0].content[0].video_url")
    assert err.value.limit == "MAX_CHAT_VIDEO_SECONDS" and "3.000 s" in str(err.value)
    monkeypatch.setattr(chat_video, "MAX_CHAT_VIDEO_FRAMES", 10)
    with pytest.raises(InvalidRequest, match="more than 10 frames"):
        load_chat_video(data, "v")


def test_frames_are_sampled_as_the_video_processor_samples_them():
    """transformers' Qwen2VLVideoProcessor.sample_frames with fps 2 (it needs torchvision to import, so its rule is
    restated here from its source): duration x fps frames, at least 4, a multiple of 2, spread evenly."""
    assert sample_indices(8, 4.0, 2) == [0, 2, 4, 6]  # 2 s: 4 frames
    assert sample_indices(90, 30.0, 2) == [0, 15, 30, 45, 60, 75]  # 3 s: 6 frames
    assert sample_indices(9, 5.0, 2) == [0, 2, 4, 6]  # 3.6 frames, raised to 4
    assert sample_indices(3, 30.0, 2) == [0, 1]  # fewer frames than min_frames: what the file has, even
    assert sample_indices(1, 30.0, 2) == []
    assert len(sample_indices(30 * 600, 30.0, 2, max_frames=768)) == 768


def test_a_video_in_a_model_without_video_placeholders_is_refused_by_index():
    from vidloom.generator import VideoGenerator

    gen = VideoGenerator.from_pretrained("qwen-omni-demo")
    messages = [{"role": "user", "content": [{"type": "text", "text": "hi"}, video_part(video_bytes(1))]}]
    with pytest.raises(InvalidRequest) as err:
        gen.chat(messages, max_tokens=2)
    assert err.value.field == "messages[0].content[1]" and "takes no video parts" in str(err.value)


def test_video_url_parts_parse_with_their_sound_option():
    data = video_bytes(1, frames=8, fps=4, sound=True)
    seen = []

    def load(raw: bytes, field: str, with_audio: bool):
        seen.append((raw == data, field, with_audio))
        return load_chat_video(raw, field, with_audio)

    (message,) = messages_from_openai([{"role": "user", "content": [video_part(data, use_audio=True)]}],
                                      load_video=load)
    assert seen == [(True, "messages[0].content[0].video_url", True)]
    assert message.content[0].type == "video" and message.content[0].video.audio.shape[0] >= 32000
    with pytest.raises(InvalidRequest) as err:
        messages_from_openai([{"role": "user", "content": [video_part(data)]}])
    assert err.value.field == "messages[0].content[0]" and "does not accept videos" in str(err.value)
