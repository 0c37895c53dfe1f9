"""Each family's demo is a real diffusers-format checkpoint, written deterministically by our own modules:
diffusers reads every model component of it with no missing and no unexpected weight."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from vidloom import registry
from vidloom.core import plugin

DEMOS = ("wan2.2-demo", "far-demo", "cosmos3-demo", "cosmos3-action-demo", "ltx2-demo", "flux2-klein-demo",
         "sana-wm-demo", "stable-audio-demo", "qwen-image-demo", "helios-demo", "helios-pyramid-demo",
         "hunyuan15-demo")
# Our LTX-2 audio VAE is its decoder (generation never encodes sound), so the demo ships no encoder weights.
ENCODER_ONLY = {("ltx2-demo", "audio_vae"): "encoder."}


@pytest.fixture(scope="module")
def demo_dirs(tmp_path_factory) -> dict[str, Path]:
    cache = tmp_path_factory.mktemp("family-demos")
    return {demo: plugin.resolve(registry.DEMOS[demo])(cache) for demo in DEMOS}


def _diffusers_components(folder: Path) -> list[tuple[str, str]]:
    """(subfolder, class) of every component diffusers builds from its own weights (config.json + safetensors)."""
    found = []
    for sub in sorted(p for p in folder.iterdir() if (p / "diffusion_pytorch_model.safetensors").is_file()):
        found.append((sub.name, json.loads((sub / "config.json").read_text())["_class_name"]))
    return found


@pytest.mark.parametrize("demo", DEMOS)
def test_diffusers_reads_every_weight_of_the_demo(demo_dirs, demo):
    import diffusers
    from diffusers.pipelines.ltx2 import LTX2TextConnectors
    from diffusers.pipelines.ltx2.latent_upsampler import LTX2LatentUpsamplerModel
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder

    pipeline_only = {"LTX2TextConnectors": LTX2TextConnectors, "LTX2Vocoder": LTX2Vocoder,
                     "LTX2LatentUpsamplerModel": LTX2LatentUpsamplerModel}
    folder = demo_dirs[demo]
    components = _diffusers_components(folder)
    assert len(components) >= 2, components
    for sub, class_name in components:
        cls = pipeline_only.get(class_name) or getattr(diffusers, class_name)
        _, info = cls.from_pretrained(str(folder / sub), output_loading_info=True)
        missing = [k for k in info["missing_keys"] if not k.startswith(ENCODER_ONLY.get((demo, sub), "\0"))]
        assert not missing and not info["unexpected_keys"], (sub, info)
        assert not info["mismatched_keys"], (sub, info)


@pytest.mark.parametrize("demo", ("cosmos3-demo", "cosmos3-action-demo", "ltx2-demo", "stable-audio-demo",
                                  "qwen-image-demo", "hunyuan15-demo"))
def test_demo_is_written_the_same_every_time(demo_dirs, tmp_path, demo):
    from safetensors.torch import load_file

    again = plugin.resolve(registry.DEMOS[demo])(tmp_path)
    for weights in sorted(demo_dirs[demo].glob("*/diffusion_pytorch_model.safetensors")):
        a, b = load_file(str(weights)), load_file(str(again / weights.parent.name / weights.name))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), weights.parent.name
