"""Single-file transformers (Wan-AI, BFL, Lightricks) and VAEs (Wan2.1, LTX-2) in their original layouts: vidloom
with the file as a component override vs diffusers' pipeline with `from_single_file` on the same file, same seed,
through vidloom.parity.

The file holds weights moved away from the folder's (tests.helpers.single_files.random_state), so a loader that
ignored the override, or converted a tensor wrongly, would fail the comparison; diffusers' converter is the reference
for our layout tables.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import torch

from tests.helpers.single_files import random_state, save, to_original
from vidloom.core.request import GenerationRequest, Task
from vidloom.generator import VideoGenerator
from vidloom.loading.key_layout import KeyLayout
from vidloom.parity import Reference, run_parity
from vidloom.families.flux2.parity import FLUX2_KLEIN
from vidloom.families.ltx2.parity import LTX2_T2V
from vidloom.families.wan.parity import WAN_I2V, WAN_T2V
from vidloom.parity.family import FamilyParity

# float32 on CPU, the bound of the families' folder parity tests (observed there: 1e-6..3e-6): loading the same
# weights from another file layout must not move frames more than loading them from the folder does. Observed
# here: Wan 4.6e-6 / I2V 2.6e-6 / ComfyUI-prefixed 1.8e-6, FLUX.2 2.1e-6, LTX-2 8.9e-7 (with its VAE from the same
# file 1.8e-6), the Wan2.1 VAE 1.7e-6, Wan2.2 A14B's second expert 1.7e-6; with the override ignored (the folder's
# weights) the frames differ by 0.45-1.0, so the bound sees a wrong or skipped tensor.
TOLERANCE = 1e-4
# The official LTX-2 file holds the whole model: a transformer override must skip the text connectors (diffusers'
# own component), the VAEs and the vocoder, as diffusers' converter does. A few stand-ins of those keys:
LTX2_OTHERS = {
    "model.diffusion_model.video_embeddings_connector.transformer_1d_blocks.0.attn1.to_q.weight": torch.ones(4, 4),
    "model.diffusion_model.audio_embeddings_connector.learnable_registers": torch.ones(8, 4),
    "vae.per_channel_statistics.mean-of-means": torch.ones(8),
    "audio_vae.per_channel_statistics.mean-of-means": torch.ones(8),
    "vocoder.conv_pre.weight": torch.ones(4, 4, 3),
}


@dataclass(frozen=True)
class Case:
    write: Callable[[Path], Path]  # the diffusers folder
    model_class: str  # the diffusers class whose from_single_file is the reference
    family: FamilyParity
    layout: Callable[[Path], KeyLayout]  # of the folder's component
    prefix: str  # what the file's keys carry in front (ComfyUI / the LTX-2 single file: model.diffusion_model.)
    request: GenerationRequest
    others: dict[str, torch.Tensor] | None = None  # other components' tensors stored in the same file
    component: str = "transformer"
    # Further (component, diffusers class, layout, prefix) parts written into the same file and overridden from it.
    more: tuple[tuple[str, str, Callable[[Path], KeyLayout], str], ...] = ()

    def parts(self) -> tuple[tuple[str, str, Callable[[Path], KeyLayout], str], ...]:
        return ((self.component, self.model_class, self.layout, self.prefix), *self.more)


def _wan(folder: Path) -> Path:
    from tests.helpers.wan_checkpoints import TINY_A, write_tiny_wan

    return write_tiny_wan(folder, TINY_A)


def _wan_b(folder: Path) -> Path:
    """TINY_B: its VAE has Wan2.1's stage layout (2 resnets per encoder stage), the one diffusers' converter fixes."""
    from tests.helpers.wan_checkpoints import TINY_B, write_tiny_wan

    return write_tiny_wan(folder, TINY_B)


def _a14b(folder: Path) -> Path:
    from tests.helpers.wan22_checkpoints import write_tiny_a14b
    from tests.helpers.wan_checkpoints import TINY_A

    return write_tiny_a14b(folder, TINY_A)


def _wan_i2v(folder: Path) -> Path:
    from tests.helpers.wan_i2v_checkpoints import write_tiny_wan_i2v

    return write_tiny_wan_i2v(folder)


def _flux2(folder: Path) -> Path:
    from tests.helpers.flux2_checkpoints import TINY_BASE, write_tiny_flux2

    return write_tiny_flux2(folder, TINY_BASE)


def _ltx2(folder: Path) -> Path:
    from tests.helpers.ltx2_checkpoints import TINY_SPLIT, write_tiny_ltx2

    return write_tiny_ltx2(folder, TINY_SPLIT)


def _wan_vae_layout(folder: Path) -> KeyLayout:
    from vidloom.loading.diffusers_dir import read_json
    from vidloom.models.wan.original_layout import wan_vae_layouts
    from vidloom.models.wan.vae import WanVAEConfig

    (layout,) = wan_vae_layouts(WanVAEConfig.from_diffusers(read_json(folder / "vae" / "config.json")))
    return layout


def _wan_layout(folder: Path) -> KeyLayout:
    from vidloom.models.wan.original_layout import WAN_ORIGINAL

    return WAN_ORIGINAL


def _flux2_layout(folder: Path) -> KeyLayout:
    from vidloom.families.flux2.original_layout import FLUX2_BFL

    return FLUX2_BFL


def _ltx2_layout(folder: Path) -> KeyLayout:
    from vidloom.models.ltx2.original_layout import LTX2_ORIGINAL

    return LTX2_ORIGINAL


def _ltx2_vae_layout(folder: Path) -> KeyLayout:
    from vidloom.models.ltx2.checkpoint import read_video_vae_config
    from vidloom.models.ltx2.original_layout import ltx2_vae_layouts

    (layout,) = ltx2_vae_layouts(read_video_vae_config(folder / "vae"))
    return layout


def _image(width: int, height: int) -> Any:
    from tests.helpers.wan_i2v_checkpoints import make_image

    return make_image(width, height, seed=0)


CASES = {
    "wan2.1-original": Case(_wan, "WanTransformer3DModel", WAN_T2V, _wan_layout, "", GenerationRequest(
        prompt="a red fox", negative_prompt="blurred", height=32, width=48, num_frames=5, num_inference_steps=3,
        guidance_scale=5.0, flow_shift=3.0, sampler="unipc", seed=42)),
    "wan2.1-i2v-original": Case(_wan_i2v, "WanTransformer3DModel", WAN_I2V, _wan_layout, "", GenerationRequest(
        prompt="the fox runs", image=_image(32, 32), height=32, width=32, num_frames=5, num_inference_steps=2,
        guidance_scale=5.0, flow_shift=3.0, seed=9)),
    "wan2.1-comfyui": Case(_wan, "WanTransformer3DModel", WAN_T2V, _wan_layout, "model.diffusion_model.",
                           GenerationRequest(prompt="a red fox", height=32, width=32, num_frames=5,
                                             num_inference_steps=2, guidance_scale=4.0, seed=3)),
    "flux2-bfl": Case(_flux2, "Flux2Transformer2DModel", FLUX2_KLEIN, _flux2_layout, "", GenerationRequest(
        prompt="a cat holding a sign", task=Task.T2I, height=32, width=48, num_inference_steps=3,
        guidance_scale=3.5, seed=11)),
    "ltx2-single-file": Case(_ltx2, "LTX2VideoTransformer3DModel", LTX2_T2V, _ltx2_layout, "model.diffusion_model.",
                             GenerationRequest(prompt="a robot dancing", negative_prompt="blurry", height=64, width=64,
                                               num_frames=9, fps=25, num_inference_steps=2, guidance_scale=3.0,
                                               seed=3), LTX2_OTHERS),
    # The whole official file: the transformer and the video VAE both from it (the VAE behind `vae.`).
    "ltx2-single-file-with-vae": Case(
        _ltx2, "LTX2VideoTransformer3DModel", LTX2_T2V, _ltx2_layout, "model.diffusion_model.",
        GenerationRequest(prompt="a robot dancing", height=64, width=64, num_frames=9, fps=25, num_inference_steps=2,
                          guidance_scale=3.0, seed=4),
        {k: v for k, v in LTX2_OTHERS.items() if not k.startswith("vae.")},
        more=(("vae", "AutoencoderKLLTX2Video", _ltx2_vae_layout, "vae."),)),
    "wan2.1-vae-original": Case(_wan_b, "AutoencoderKLWan", WAN_T2V, _wan_vae_layout, "", GenerationRequest(
        prompt="a red fox", height=32, width=32, num_frames=5, num_inference_steps=2, guidance_scale=4.0, seed=5),
        component="vae"),
    # Wan2.2 A14B's low-noise expert from a file, the high-noise one from the folder; 6 steps at shift 5 run both.
    "wan2.2-a14b-transformer_2": Case(_a14b, "WanTransformer3DModel", WAN_T2V, _wan_layout, "", GenerationRequest(
        prompt="a red fox", negative_prompt="blurred", height=32, width=48, num_frames=5, num_inference_steps=6,
        guidance_scale=5.0, guidance_scale_2=2.5, flow_shift=5.0, seed=42), component="transformer_2"),
}


def _original_file(case: Case, folder: Path, out: Path) -> Path:
    import diffusers

    state = dict(case.others or {})
    for seed, (component, model_class, layout, prefix) in enumerate(case.parts(), start=7):
        reference = getattr(diffusers, model_class).from_pretrained(str(folder / component))
        state.update(to_original(layout(folder), random_state(reference, seed=seed), prefix))
    return save(state, out)


def _reference(case: Case, folder: Path, file: Path) -> Any:
    import diffusers

    components = {component: getattr(diffusers, model_class).from_single_file(
        str(file), config=str(folder), subfolder=component, torch_dtype=torch.float32)
        for component, model_class, _, _ in case.parts()}
    pipe = getattr(diffusers, case.family.pipeline).from_pretrained(
        str(folder), dtype=torch.float32, **{**components, **case.family.load_kwargs})
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.mark.parametrize("name", list(CASES))
def test_original_layout_file_matches_diffusers_from_single_file(name, tmp_path):
    case = CASES[name]
    folder = case.write(tmp_path / "folder")
    file = _original_file(case, folder, tmp_path / f"{case.component}.safetensors")
    generator = VideoGenerator.from_pretrained(folder, device="cpu", dtype="float32",
                                               components={part[0]: file for part in case.parts()})
    result = run_parity(folder, case.request, generator=generator,
                        reference=Reference.wrap(_reference(case, folder, file), case.family))
    report = result.report.format()
    diff = float(np.abs(result.ours - result.theirs).max())
    assert diff <= TOLERANCE, f"{name}: max abs diff {diff:.3e}\n{report}"
    assert result.theirs.std() > 1e-3, "reference output is flat; the test would prove nothing"
    assert result.report.ok, report
