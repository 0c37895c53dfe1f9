"""Pipelines the adapter runs as they are, with the rules they keep for themselves: the Helios pyramid rounds a frame
count the Wan VAE could not encode up to whole chunks, the distilled pyramid's model_index.json holds config values beside its components, and
an error inside a pipeline reaches the caller as ours while the model keeps serving; a pipeline without a step hook
is one opaque step."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.adapter_checkpoints import reference_output, write_tiny_pipeline
from vidloom.core.errors import Cancelled, InvalidRequest
from vidloom.core.output import ProgressEvent
from vidloom.families.diffusers_adapter.loop import PipelineFailed
from vidloom.families.diffusers_adapter.preflight import check_inputs
from vidloom.generator import VideoGenerator
from vidloom.runtime.request_run import CancellationToken

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning", "ignore::UserWarning")
PROMPT = "a red fox runs through snow"
SIZE = dict(height=32, width=32)
PYRAMID = dict(height=64, width=64)  # three stages halve the latent twice before 2x2 patches


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return {kind: write_tiny_pipeline(tmp_path_factory.mktemp(kind), kind)
            for kind in ("helios-pyramid", "helios-distilled")}


def _adapter(folder) -> VideoGenerator:
    """The adapter on `folder` (the Helios pyramid is native now; the adapter must still run it as it is)."""
    from vidloom import registry
    from vidloom.core.deploy import DeployConfig
    from vidloom.families.diffusers_adapter.cards import card_from_checkpoint
    from vidloom.runtime.engine import Engine
    from vidloom.core import plugin

    card = card_from_checkpoint(folder)
    instance = registry.load_instance(card, folder, torch.device("cpu"), None, DeployConfig())
    return VideoGenerator(Engine(instance, plugin.resolve(card.program)(instance)))


def test_the_pyramid_takes_a_frame_count_the_wan_vae_rule_would_refuse_and_equals_the_pipeline(folders):
    assert VideoGenerator.from_pretrained(str(folders["helios-pyramid"])).card.family == "helios"  # native
    gen = _adapter(folders["helios-pyramid"])
    assert gen.card.family == "diffusers-adapter"
    result = gen.generate(PROMPT, num_frames=30, guidance_scale=1.0, seed=3, **PYRAMID)
    expected = reference_output(folders["helios-pyramid"], PROMPT, 3, num_frames=30, guidance_scale=1.0, **PYRAMID)
    assert expected.shape[0] == 33 and result.frames.shape == expected.shape  # one whole 33-frame chunk
    np.testing.assert_array_equal(result.frames, expected)


def test_the_distilled_pyramid_folder_loads_beside_its_config_flags(folders):
    from vidloom import registry
    from vidloom.families.diffusers_adapter.cards import card_from_checkpoint

    assert registry.resolve_card(folders["helios-distilled"]).family == "helios"  # native, DMD path included
    card = card_from_checkpoint(folders["helios-distilled"])  # crashed on model_index.json's `is_distilled: true`
    assert "is_distilled" not in card.components and {"transformer", "vae", "scheduler"} <= set(card.components)


def test_an_error_inside_the_pipeline_fails_the_request_as_ours_and_the_model_keeps_serving(folders):
    gen = _adapter(folders["helios-pyramid"])
    # diffusers' CFG-Zero* branch views a non-contiguous prediction: a RuntimeError inside the pipeline.
    with pytest.raises(PipelineFailed, match=r"HeliosPyramidPipeline failed .*RuntimeError: view size"):
        gen.generate(PROMPT, num_frames=33, guidance_scale=5.0, seed=1, **PYRAMID)
    result = gen.generate(PROMPT, num_frames=33, guidance_scale=1.0, seed=1, **PYRAMID)  # no CFG: no such branch
    assert result.frames.shape == (33, 64, 64, 3)


def test_the_pipelines_own_input_check_refuses_under_our_field_name(folders):
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(str(folders["helios-pyramid"]))
    image = np.zeros((32, 32, 3), np.uint8)
    with pytest.raises(InvalidRequest) as excinfo:
        check_inputs(pipe, {"prompt": PROMPT, "image": image, "video": [image]}, {"image": "image", "video": "video"})
    assert excinfo.value.field == "image" and "HeliosPyramidPipeline refused it" in str(excinfo.value)
    check_inputs(pipe, {"prompt": PROMPT, "height": 32, "width": 32}, {})  # a valid call passes


def test_a_pipeline_without_a_step_hook_is_one_step_with_progress_and_cancel_before_it_starts(tmp_path):
    folder = write_tiny_pipeline(tmp_path / "ldm", "ldm")
    gen = VideoGenerator.from_pretrained(str(folder))
    events: list = []
    chunks = list(gen.generate_stream(PROMPT, num_inference_steps=3, seed=2, on_event=events.append, **SIZE))
    expected = reference_output(folder, PROMPT, 2, num_inference_steps=3, **SIZE)
    np.testing.assert_array_equal(chunks[0].chunk.frames, expected)
    steps = [(e.step, e.total) for e in events if isinstance(e, ProgressEvent) and e.phase == "pipeline"]
    assert steps == [(1, 1)]  # the whole call: one step (its 3 denoising steps inside it)
    cancel = CancellationToken()
    cancel.cancel()
    with pytest.raises(Cancelled):
        gen.generate(PROMPT, num_inference_steps=3, seed=2, cancel=cancel, **SIZE)
