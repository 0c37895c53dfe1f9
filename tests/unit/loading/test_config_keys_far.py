"""AnyFlow-FAR: every key of AnyFlowFARPipeline, AnyFlowFARTransformer3DModel and FlowMapEulerDiscreteScheduler
is read or refused (the VAE is Wan's AutoencoderKLWan, checked in test_config_keys_wan)."""

from __future__ import annotations

import pytest

diffusers = pytest.importorskip("diffusers")

from vidloom.core.errors import CheckpointError  # noqa: E402
from vidloom.diffusion.sampler import SamplerConfig  # noqa: E402
from vidloom.diffusion.scheduler_keys import FLOW_MAP_POLICY  # noqa: E402
from vidloom.families.wan_causal.config import TRANSFORMER_POLICY, FarTransformerConfig  # noqa: E402
from vidloom.families.wan_causal.load import FAR_INDEX_COMPONENTS  # noqa: E402
from tests.helpers.config_keys import (  # noqa: E402
    FUTURE_KEY, assert_keys_classified, assert_policy_classified, assert_refuses_unknown, merge_keys,
)
from tests.helpers.far_checkpoints import FAR_A, write_tiny_far  # noqa: E402


def test_model_index_keys_are_classified():
    assert_keys_classified(diffusers.AnyFlowFARPipeline, FAR_INDEX_COMPONENTS)


def test_transformer_keys_are_classified():
    assert_policy_classified(diffusers.AnyFlowFARTransformer3DModel, TRANSFORMER_POLICY)
    assert_refuses_unknown(FarTransformerConfig.from_diffusers, errors=(CheckpointError,))


def test_scheduler_keys_are_classified():
    name = "FlowMapEulerDiscreteScheduler"
    assert_policy_classified(diffusers.FlowMapEulerDiscreteScheduler, FLOW_MAP_POLICY)
    assert_refuses_unknown(SamplerConfig.from_diffusers, {"_class_name": name}, errors=(CheckpointError,))


def test_unknown_model_index_key_is_refused_at_load(tmp_path):
    from vidloom.generator import VideoGenerator

    folder = write_tiny_far(tmp_path / "far", FAR_A)
    merge_keys(folder / "model_index.json", **{FUTURE_KEY: True})
    with pytest.raises(CheckpointError, match=rf"{folder}/model_index.json: unsupported config key\(s\) {FUTURE_KEY}"):
        VideoGenerator.from_pretrained(folder, device="cpu")
