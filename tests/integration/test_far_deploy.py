"""AnyFlow-FAR deploy options: the ones its rollout cannot honour are refused at load, naming the option."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.far_checkpoints import FAR_A, write_tiny_far
from vidloom import placement
from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import DeployError
from vidloom.generator import VideoGenerator


@pytest.fixture(scope="module")
def far_dir(tmp_path_factory):
    return write_tiny_far(tmp_path_factory.mktemp("far-deploy"), FAR_A)


def test_cfg_mode_is_refused_at_load_with_the_cards_reason(far_dir):
    with pytest.raises(DeployError, match=r"\(anyflow-far\) does not support cfg_mode \(--cfg-mode.*one batch"):
        VideoGenerator.from_pretrained(far_dir, device="cpu", deploy=DeployConfig(cfg_mode="batched"))


def test_fp8_with_float16_on_cuda_is_refused_before_touching_the_device(far_dir, monkeypatch):
    # No CUDA here: let the device check pass so the load reaches the FP8 dtype check, which must
    # refuse before any weight is moved (moving one would fail on this machine).
    monkeypatch.setattr(placement, "resolve_device", lambda device: torch.device("cuda"))
    with pytest.raises(DeployError, match="--fp8.*bfloat16"):
        VideoGenerator.from_pretrained(far_dir, device="cuda", dtype="float16", deploy=DeployConfig(fp8_weights=True))
