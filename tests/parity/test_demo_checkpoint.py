"""The built-in demo is a real diffusers-format Wan checkpoint: diffusers loads it and agrees."""

from __future__ import annotations

import numpy as np
import torch

from vidloom.core.request import GenerationRequest
from vidloom.generator import VideoGenerator
from vidloom.families.wan.demo import DEMO_ID, DEMO_VERSION, ensure_demo_checkpoint
from tests.helpers.reference_pipelines import reference_pipeline


def test_demo_written_once_and_reused(demo_cache):
    folder = ensure_demo_checkpoint(demo_cache)
    assert folder.name == f"{DEMO_ID}-v{DEMO_VERSION}"
    stamp = (folder / "transformer" / "diffusion_pytorch_model.safetensors").stat().st_mtime_ns
    assert ensure_demo_checkpoint(demo_cache) == folder
    assert (folder / "transformer" / "diffusion_pytorch_model.safetensors").stat().st_mtime_ns == stamp
    assert not [p for p in demo_cache.iterdir() if p.name.startswith(".")], "staging dir left behind"


def test_demo_is_deterministic(tmp_path):
    from safetensors.torch import load_file

    a, b = ensure_demo_checkpoint(tmp_path / "a"), ensure_demo_checkpoint(tmp_path / "b")
    for sub in ("transformer", "vae"):
        sa = load_file(str(a / sub / "diffusion_pytorch_model.safetensors"))
        sb = load_file(str(b / sub / "diffusion_pytorch_model.safetensors"))
        assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_demo_matches_diffusers_wan_pipeline(demo_cache):
    from diffusers import WanPipeline

    folder = ensure_demo_checkpoint(demo_cache)
    pipe = reference_pipeline(WanPipeline, folder)
    kw = dict(height=32, width=48, num_frames=5, num_inference_steps=3, guidance_scale=5.0)
    expected = pipe(prompt="waves crash against the rocks", negative_prompt="", output_type="np",
                    generator=torch.Generator("cpu").manual_seed(11), **kw).frames[0]
    gen = VideoGenerator.from_pretrained(DEMO_ID, device="cpu", cache_dir=demo_cache)
    got = gen.engine.run(GenerationRequest(
        prompt="waves crash against the rocks", negative_prompt="", height=32, width=48, num_frames=5,
        num_inference_steps=3, guidance_scale=5.0, seed=11,
    ))["video"]
    # Same tolerance and reason as tests/parity/test_wan_generation.py.
    assert float(np.abs(got - expected).max()) <= 1e-4
