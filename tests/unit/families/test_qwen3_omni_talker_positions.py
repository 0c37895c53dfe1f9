"""The talker's positions of a video's rows (speech_codes.talker_positions) equal transformers' talker
get_rope_index as generate(return_audio=True) calls it: without use_audio_in_video (generate never passes it on)."""

from __future__ import annotations

import functools
import types

import torch

from tests.unit.families.test_qwen3_omni_inputs import _video_prompt
from vidloom.families.qwen3_omni.encoders import audio_output_length
from vidloom.families.qwen3_omni.speech_codes import talker_positions
from vidloom.models.omni_media import MediaPiece, PromptMedia
from vidloom.models.omni_towers import AUDIO, IMAGE, VIDEO

IMAGE_GRID = [1, 4, 4]  # 4 rows on a 2 x 2 merged grid


def _reference(ids, images, videos, spg: float, frames: int, per_second: float):
    from transformers import Qwen3OmniMoeTalkerConfig
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
        Qwen3OmniMoePreTrainedModelForConditionalGeneration as M)

    config = Qwen3OmniMoeTalkerConfig(image_token_id=8, audio_token_id=3, video_token_id=9, vision_start_token_id=6,
                                      audio_start_token_id=4, position_id_per_seconds=per_second)
    config.audio_config = types.SimpleNamespace(n_window=50)  # the talker reads the thinker's (a 5.25 bug)
    fake = types.SimpleNamespace(config=config, spatial_merge_size=2)
    fake.get_llm_pos_ids_for_vision = functools.partial(M.get_llm_pos_ids_for_vision, fake)
    return M.get_rope_index(fake, ids[None], images, videos, torch.ones_like(ids)[None], False,
                            torch.tensor([frames]), torch.tensor([spg]))


def test_a_video_with_its_sound_is_placed_as_generates_talker_places_it():
    """Alone, the talker reads the track as an audio clip (every row one position on); before an image it finds
    the video first and interleaves frames and sound by its own position_id_per_seconds (here not the thinker's,
    which widened the prompt)."""
    grid, frames, spg, thinker_rate, talker_rate = [3, 4, 4], 120, 1.0, 13, 25
    tokens = audio_output_length(frames)
    for image in (False, True):
        ids = _video_prompt(grid, tokens, spg, thinker_rate)
        if image:
            ids = ids[:-2] + [6, 8, 8, 8, 8, 7] + ids[-2:]
        ids = torch.tensor(ids)
        video_at, audio_at = torch.nonzero(ids == 9).flatten(), torch.nonzero(ids == 3).flatten()
        pieces = [MediaPiece(VIDEO, torch.zeros(1), torch.tensor([grid]), video_at, spg, thinker_rate, audio_at),
                  MediaPiece(AUDIO, torch.zeros(1), None, audio_at)]
        if image:
            pieces.append(MediaPiece(IMAGE, torch.zeros(1), torch.tensor([IMAGE_GRID]),
                                     torch.nonzero(ids == 8).flatten()))
        speech = types.SimpleNamespace(spatial_merge_size=2, position_id_per_seconds=talker_rate)
        media = PromptMedia(tuple(pieces), torch.zeros(3, len(ids)), 0)
        ours, delta = talker_positions(torch.ones(len(ids), dtype=torch.bool), len(ids), media, speech)
        expected, expected_delta = _reference(ids, torch.tensor([IMAGE_GRID]) if image else None,
                                              torch.tensor([grid]), spg, frames, talker_rate)
        assert torch.equal(ours.float(), expected[:, 0]), image
        assert delta == int(expected_delta)
        assert bool((ours[0] == torch.arange(len(ids))).all()) != image  # alone: one position per row
