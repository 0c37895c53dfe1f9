"""Helios pyramid: routing by model_index.json (class, is_distilled, is_cfg_zero_star), the card's defaults and
sizes, the scheduler's stage keys, and the block-noise factor at the published gamma."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from vidloom.core.errors import CheckpointError
from vidloom.families.helios.cards import DISTILLED_NOTE, ZERO_STAR_NOTE, card_from_checkpoint, check_pipeline
from vidloom.families.helios.demo import DEMO_SCHEDULER
from vidloom.families.helios.pyramid import block_noise_factor, split_steps, stage_ranges
from vidloom.families.helios.schedule import HeliosSchedule
from vidloom.loading.diffusers_dir import DiffusersDir

COMPONENTS = {"tokenizer": ["transformers", "T5TokenizerFast"], "text_encoder": ["transformers", "UMT5EncoderModel"],
              "vae": ["diffusers", "AutoencoderKLWan"], "scheduler": ["diffusers", "HeliosScheduler"],
              "transformer": ["diffusers", "HeliosTransformer3DModel"]}


def _folder(tmp_path: Path, scheduler: dict, scheduler_class: str = "HeliosScheduler", **settings) -> Path:
    (tmp_path / "scheduler").mkdir()
    (tmp_path / "scheduler" / "scheduler_config.json").write_text(json.dumps({**DEMO_SCHEDULER, **scheduler}))
    index = {"_class_name": "HeliosPyramidPipeline", **COMPONENTS, "scheduler": ["diffusers", scheduler_class],
             **settings}
    (tmp_path / "model_index.json").write_text(json.dumps(index))
    return tmp_path


def test_a_mid_folder_gets_the_pyramid_card(tmp_path):
    card = card_from_checkpoint(_folder(tmp_path, {"stages": 3}, is_cfg_zero_star=True, is_distilled=False))
    assert card.sampling_defaults.num_inference_steps == 30 and card.sampling_defaults.guidance_scale == 5.0
    assert card.geometry.spatial_multiple == 64  # 16 x 2^(3 - 1): the first stage's grid still patches 2x2
    assert ZERO_STAR_NOTE in card.notes


def test_a_distilled_folder_gets_the_distilled_card(tmp_path):
    folder = _folder(tmp_path, {"_class_name": "HeliosDMDScheduler", "stages": 3}, "HeliosDMDScheduler",
                     is_cfg_zero_star=False, is_distilled=True)
    card = card_from_checkpoint(folder)
    assert card.family == "helios" and DISTILLED_NOTE in card.notes and "distilled" in card.request_blocks
    defaults = card.sampling_defaults  # diffusers' Helios-Distilled example: [2, 2, 2] steps, guidance 1.0
    assert (defaults.num_inference_steps, defaults.guidance_scale, defaults.sampler) == (6, 1.0, "dmd")
    assert card.geometry.spatial_multiple == 64


@pytest.mark.parametrize("scheduler_class,distilled", [("HeliosScheduler", True), ("HeliosDMDScheduler", False)])
def test_is_distilled_and_the_dmd_scheduler_go_together(tmp_path, scheduler_class, distilled):
    folder = _folder(tmp_path, {"stages": 3}, scheduler_class, is_distilled=distilled)
    with pytest.raises(CheckpointError, match="is_distilled is"):
        check_pipeline(DiffusersDir.open(folder))


def test_the_pyramid_scheduler_keys():
    with pytest.raises(CheckpointError, match="stages"):
        HeliosSchedule.from_diffusers({**DEMO_SCHEDULER, "stages": 1}, pyramid=True)
    with pytest.raises(CheckpointError, match="stage_range"):
        HeliosSchedule.from_diffusers({**DEMO_SCHEDULER, "stages": 3, "stage_range": [0, 1]}, pyramid=True)
    schedule = HeliosSchedule.from_diffusers({**DEMO_SCHEDULER, "stages": 3, "gamma": 0.25}, pyramid=True)
    ranges = stage_ranges(schedule)
    assert [r.timestep_max for r in ranges][0] == 999 and ranges[0].timestep_max > ranges[1].timestep_max
    assert ranges[1].timestep_max > ranges[2].timestep_max > ranges[2].timestep_min >= 0


def test_steps_split_over_the_stages():
    assert split_steps(30, 3) == (10, 10, 10) and split_steps(5, 3) == (2, 2, 1) and split_steps(5, 2) == (3, 2)


def test_the_block_factor_at_the_published_gamma():
    """At gamma 1/3 the float32 covariance is singular to float32 rounding: whether float32 Cholesky fails (the
    reference's CPU failure) or returns a rounding-sized last pivot depends on the machine's LAPACK code path (it
    failed on some CI CPUs, passes on an AVX-512 Xeon). Ours is factored in float64 wherever it runs."""
    cov = torch.eye(4, dtype=torch.float64) * (1 + 1 / 3) - torch.ones(4, 4, dtype=torch.float64) / 3
    cov += torch.eye(4, dtype=torch.float64) * 1e-8
    assert torch.linalg.eigvalsh(cov.float().double()).min() < 1e-7  # float32 rounding leaves no margin
    factor = block_noise_factor(1 / 3, 4)
    assert factor.dtype == torch.float32 and torch.equal(factor, torch.linalg.cholesky(cov).float())
    assert torch.allclose(factor.double() @ factor.double().T, cov, atol=1e-6)
