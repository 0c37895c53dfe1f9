"""AnyFlow-FAR recipe: chunk partitions, registry detection, deploy refusals."""

from __future__ import annotations

import json

import pytest
import torch

from vidloom import registry
from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import CheckpointError, DeployError
from vidloom.families.wan_causal.cards import FAMILY
from vidloom.families.wan_causal.loop import chunk_partition

RELEASED = (1, 3, 3, 3, 3, 3, 3, 2)


@pytest.mark.parametrize(
    ("latent_frames", "expected"),
    [(21, RELEASED), (1, (1,)), (4, (1, 3)), (5, (1, 3, 1)), (9, (1, 3, 3, 2)), (22, (1, 3, 3, 3, 3, 3, 3, 3))],
)
def test_chunk_partition_covers_every_frame(latent_frames, expected):
    partition = chunk_partition(latent_frames, RELEASED)
    assert partition == expected
    assert sum(partition) == latent_frames and min(partition) >= 1


def _folder(path, pipeline: str = "AnyFlowFARPipeline", shift: float = 5.0):
    (path / "scheduler").mkdir()
    index = {"_class_name": pipeline, "scheduler": ["diffusers", "FlowMapEulerDiscreteScheduler"]}
    (path / "model_index.json").write_text(json.dumps(index))
    (path / "scheduler" / "scheduler_config.json").write_text(
        json.dumps({"_class_name": "FlowMapEulerDiscreteScheduler", "shift": shift})
    )
    return path


def test_registry_detects_far_folders_by_pipeline_class(tmp_path):
    _folder(tmp_path, shift=7.0)
    card = registry.resolve_card(tmp_path)
    assert card.family == FAMILY
    assert card.sampling_defaults.flow_shift == 7.0
    assert card.sampling_defaults.sampler == "flow_map_euler"
    assert list(card.loops) == ["rollout"]


def test_unsupported_deploy_options_fail_at_load(tmp_path):
    _folder(tmp_path)
    card = registry.resolve_card(tmp_path)
    with pytest.raises(DeployError, match="cfg_mode"):
        registry.load_instance(card, tmp_path, torch.device("cpu"), None, DeployConfig(cfg_mode="batched"))
    # The rollout's steps are captured (static KV slabs: tests/integration/test_far_cuda_graphs.py).
    assert "cuda_graphs" in card.capabilities.supported and "cuda_graphs" not in card.capabilities.why_not


def test_wrong_pipeline_class_is_refused(tmp_path):
    _folder(tmp_path, pipeline="WanPipeline")
    from vidloom.families.wan_causal.cards import far_card
    from vidloom.families.wan_causal.load import load_instance

    with pytest.raises(CheckpointError, match="AnyFlowFARPipeline"):
        load_instance(far_card("x", str(tmp_path)), tmp_path, torch.device("cpu"), None, DeployConfig())
