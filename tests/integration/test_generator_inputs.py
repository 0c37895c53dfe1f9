"""VideoGenerator input checks (device, dtype, prompt type) and hub repo ids from an offline cache."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vidloom import InvalidRequest, VideoGenerator
from vidloom.core.errors import DeployError

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA message")
def test_cuda_without_cuda_is_a_deploy_error_naming_device(demo_cache):
    with pytest.raises(DeployError, match="device: 'cuda' asked for CUDA"):
        VideoGenerator.from_pretrained("wan2.1-demo", device="cuda", cache_dir=demo_cache)


@pytest.mark.parametrize("device", ["gpu", "mps"])
def test_unknown_device_is_refused(demo_cache, device):
    with pytest.raises(DeployError, match="device"):
        VideoGenerator.from_pretrained("wan2.1-demo", device=device, cache_dir=demo_cache)


@pytest.mark.parametrize("dtype", ["float8", "int8", torch.float64])
def test_unsupported_dtype_is_refused_naming_dtype(demo_cache, dtype):
    with pytest.raises(DeployError, match="dtype: .* use one of float32, bfloat16, float16"):
        VideoGenerator.from_pretrained("wan2.1-demo", device="cpu", dtype=dtype, cache_dir=demo_cache)


def test_a_list_of_prompts_is_a_clear_invalid_request(demo_cache):
    generator = VideoGenerator.from_pretrained("wan2.1-demo", device="cpu", cache_dir=demo_cache)
    with pytest.raises(InvalidRequest, match="batches are not supported") as info:
        generator.generate(["a cat", "a dog"], num_inference_steps=1)
    assert info.value.field == "prompt"


def fake_hub_cache(hf_home: Path, repo_id: str, checkpoint: Path) -> Path:
    """huggingface_hub's cache layout: hub/models--org--name/snapshots/<rev>/... and refs/main."""
    repo = hf_home / "hub" / f"models--{repo_id.replace('/', '--')}"
    revision = "0123456789abcdef0123456789abcdef01234567"
    shutil.copytree(checkpoint, repo / "snapshots" / revision)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(revision)
    return repo / "snapshots" / revision


def test_from_pretrained_with_a_hub_repo_id_reads_the_offline_cache(wan_demo_checkpoint, tmp_path):
    checkpoint = wan_demo_checkpoint
    snapshot = fake_hub_cache(tmp_path / "hf", "Wan-AI/Wan2.1-T2V-1.3B-Diffusers", checkpoint)
    code = (
        "from vidloom import VideoGenerator\n"
        "g = VideoGenerator.from_pretrained('Wan-AI/Wan2.1-T2V-1.3B-Diffusers', device='cpu')\n"
        "v = g.generate('a cat', height=32, width=48, num_frames=5, num_inference_steps=1, seed=1)\n"
        "print(g.card.model_id, g.card.source, v.frames.shape)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    env.pop("HF_HUB_CACHE", None)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    model_id, source, shape = proc.stdout.split(" ", 2)
    assert model_id == "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"
    assert Path(source) == snapshot and shape.strip() == "(5, 32, 48, 3)"
