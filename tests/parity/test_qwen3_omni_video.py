"""Qwen3-Omni video parts (and a video read with its sound track): our thinker vs transformers, float32 CPU, on both
tiny thinker configurations.

transformers' video processor needs torchvision, so the reference is fed what our preprocessing made (the sampled
frames' patches, their grid and seconds per grid step, the sound track's Whisper features) and its prompt is widened
by the processor's own rules (`Qwen3OmniMoeProcessor.replace_video_with_audio_token` for the interleaving). Greedy
ids must equal `thinker.generate`'s and the logits after the prompt the thinker forward's within 1e-4. Our
per-frame maths is checked separately against the Qwen2-VL image processor on each sampled frame.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from tests.helpers.chat_videos import video_bytes, video_part
from tests.parity.test_qwen3_omni_inputs import LOGITS_ATOL, QUESTION, assert_matches_the_thinker, our_first_logits
from tests.parity.test_qwen3_omni_inputs import tiny  # noqa: F401  (the tiny checkpoints fixture, shared)
from vidloom.families.qwen3_omni.encoders import audio_output_length
from vidloom.media.chat_video import load_chat_video
from vidloom.models.omni_towers import load_processors
from vidloom.models.omni_video import MAX_FRAME_TOKENS, MIN_FRAME_TOKENS, sample_indices, video_inputs

MAX_TOKENS = 10
# Our frames vs the image processor's: float32 rounding of rescale and normalise done in another order.
PIXEL_ATOL = 1e-6


def reference_inputs(folder, tokenizer, data: bytes, sound: bool) -> dict:
    """Our preprocessing's tensors, the prompt widened by the processor's rules."""
    extractor, image_processor = load_processors(folder)
    video = load_chat_video(data, "video", sound)
    sampled = video_inputs(video, image_processor)
    parts = [{"type": "video"}, {"type": "text", "text": QUESTION}]
    text = tokenizer.apply_chat_template([{"role": "user", "content": parts}], tokenize=False,
                                         add_generation_prompt=True)
    inputs = {"pixel_values_videos": sampled.patches, "video_grid_thw": sampled.grid_thw,
              "video_second_per_grid": torch.tensor([sampled.second_per_grid])}
    if not sound:
        return _tokenized(tokenizer, text.replace("<|video_pad|>", "<|video_pad|>" * (
            int(sampled.grid_thw.prod()) // 4)), inputs)
    feats = extractor(video.audio, sampling_rate=16000, padding="max_length", return_attention_mask=True,
                      return_tensors="pt")
    from transformers.models.qwen3_omni_moe.processing_qwen3_omni_moe import Qwen3OmniMoeProcessor

    processor = SimpleNamespace(audio_bos_token="<|audio_start|>", audio_eos_token="<|audio_end|>",
                                video_token="<|video_pad|>", audio_token="<|audio_pad|>",
                                video_processor=SimpleNamespace(merge_size=2))
    config = json_config(folder)
    widened = Qwen3OmniMoeProcessor.replace_video_with_audio_token(
        processor, {"video_grid_thw": sampled.grid_thw, "video_second_per_grid": [sampled.second_per_grid]}, 0,
        {"num_audio_tokens": [audio_output_length(int(feats["attention_mask"].sum()))]}, 0,
        position_id_per_seconds=config["thinker_config"]["position_id_per_seconds"])
    inputs.update(input_features=feats["input_features"], feature_attention_mask=feats["attention_mask"],
                  use_audio_in_video=True)
    return _tokenized(tokenizer, text.replace("<|video_pad|>", widened), inputs)


def json_config(folder) -> dict:
    import json

    return json.loads((folder / "config.json").read_text())


def _tokenized(tokenizer, text: str, inputs: dict) -> dict:
    ids = tokenizer(text, return_tensors="pt")
    return {"input_ids": ids["input_ids"], "attention_mask": ids["attention_mask"], **inputs}


def conversation(data: bytes, sound: bool) -> list[dict]:
    return [{"role": "user", "content": [video_part(data, sound), {"type": "text", "text": QUESTION}]}]


@pytest.mark.parametrize("sound", [False, True], ids=["video", "video+audio"])
def test_greedy_ids_and_logits_match_the_thinker(tiny, sound):
    folder, model, gen = tiny
    tokenizer = gen.engine.instance["tokenizer"]
    data = video_bytes(1, frames=9, size=(80, 64), fps=4, sound=sound)
    messages = conversation(data, sound)
    inputs = reference_inputs(folder, tokenizer, data, sound)
    if sound:  # the interleaving is not trivial: a sound token sits between two frames' tokens
        ids = inputs["input_ids"][0].tolist()
        video, audio = (tokenizer.convert_tokens_to_ids(t) for t in ("<|video_pad|>", "<|audio_pad|>"))
        first_audio = ids.index(audio)
        assert video in ids[first_audio:]
    ours = assert_matches_the_thinker(gen, model, messages, inputs, MAX_TOKENS)
    # the frames matter: another video moves the logits far past the tolerance
    other = conversation(video_bytes(2, frames=9, size=(80, 64), fps=4, sound=sound), sound)
    assert (our_first_logits(gen, other) - ours).abs().max() > 1000 * LOGITS_ATOL
    assert gen.engine.decoder.stats()["kv_blocks_in_use"] == 0


@pytest.mark.parametrize("size", [(80, 64), (50, 90), (640, 360)])
def test_sampled_frames_equal_the_image_processor_per_frame(tmp_path, size):
    """Each sampled frame's slice of our patches equals the Qwen2-VL image processor's patches of that frame (its
    smart_resize within the video pixel bounds picks the same size)."""
    from vidloom.models.omni_towers import write_processor_config

    write_processor_config(tmp_path, 16, 4, 16, 128 * 128, "Qwen3OmniMoeProcessor")
    _, processor = load_processors(tmp_path)
    video = load_chat_video(video_bytes(2, frames=9, size=size, fps=5), "video")
    sampled = video_inputs(video, processor)
    gt, gh, gw = sampled.grid_thw[0].tolist()
    ours = sampled.patches.view(gt, gh * gw, 3, 2, 16, 16)
    frames = video.frames(sample_indices(video.frame_count, video.fps, 2))
    assert frames.shape[0] == 2 * gt == 4  # 9 frames at 5 fps: 3.6 at 2 fps, raised to min_frames
    bounds = {"shortest_edge": MIN_FRAME_TOKENS * 32 * 32, "longest_edge": MAX_FRAME_TOKENS * 32 * 32}
    for k, frame in enumerate(frames):
        ref = processor(images=[Image.fromarray(frame)], return_tensors="pt", size=bounds)
        assert ref["image_grid_thw"].tolist() == [[1, gh, gw]]
        expected = ref["pixel_values"].view(gh * gw, 3, 2, 16, 16)[:, :, 0]
        np.testing.assert_allclose(ours[k // 2, :, :, k % 2].numpy(), expected.numpy(), atol=PIXEL_ATOL, rtol=0)
