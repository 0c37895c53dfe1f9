"""Flux2 Klein through the user-facing APIs: VideoGenerator.generate(image=...) and `vidloom generate`."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from vidloom.core.errors import InvalidRequest
from vidloom.generator import VideoGenerator


@pytest.fixture(scope="module")
def klein(flux2_distilled_dir):
    return VideoGenerator.from_pretrained(flux2_distilled_dir, device="cpu")


def _ref(tmp_path, w=64, h=64, name="ref.png"):
    rng = np.random.default_rng(0)
    path = tmp_path / name
    Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(path)
    return path


def test_generate_returns_one_frame_that_saves_as_png(klein, tmp_path):
    out = klein.generate("a red fox", height=32, width=48, num_inference_steps=1, seed=1)
    assert out.frames.shape == (1, 32, 48, 3) and out.frames.dtype == np.uint8
    assert out.metadata["task"] == "t2i"
    path = out.save(tmp_path / "x.png")
    assert np.array_equal(np.asarray(Image.open(path)), out.frames[0])
    assert Image.open(out.save(tmp_path / "x.webp")).size == (48, 32)


def test_image_accepts_paths_arrays_and_pil_alike(klein, tmp_path):
    path = _ref(tmp_path)
    array = np.asarray(Image.open(path))
    kw = dict(num_inference_steps=1, seed=2)
    by_path = klein.generate("make it purple", image=path, **kw)
    assert by_path.frames.shape == (1, 64, 64, 3)  # size from the reference
    assert np.array_equal(by_path.frames, klein.generate("make it purple", image=array, **kw).frames)
    two = klein.generate("make it purple", image=[Image.open(path), path], **kw)
    assert not np.array_equal(two.frames, by_path.frames)  # the second reference conditions the result


@pytest.mark.parametrize("image, message", [
    (np.zeros((32, 64, 3), np.uint8), "at least 64 px"),
    ([np.zeros((64, 64, 3), np.uint8)] * 5, "limit of 4"),
    (b"not an image", "not a readable image"),
    ("/nonexistent.png", "does not exist"),
])
def test_bad_images_name_the_field(klein, image, message):
    with pytest.raises(InvalidRequest, match=message) as info:
        klein.generate("x", image=image, num_inference_steps=1)
    assert info.value.field.startswith("image")


def test_cli_generates_png_with_reference_images(flux2_distilled_dir, tmp_path):
    out = tmp_path / "edit.png"
    ref = _ref(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "vidloom.cli", "generate", "--model", str(flux2_distilled_dir), "--prompt", "a cat",
         "--output", str(out), "--steps", "1", "--seed", "4", "--image", str(ref), "--image", str(ref)],
        capture_output=True, text=True, env={**os.environ}, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert Image.open(out).size == (64, 64)
    assert f"wrote {out.resolve()}" in proc.stdout


def test_wan_only_deploy_options_fail_at_load_naming_them(flux2_distilled_dir):
    from vidloom.core.deploy import DeployConfig
    from vidloom.core.errors import DeployError

    with pytest.raises(DeployError, match=r"\(flux2\) does not support offload_idle_expert"):
        VideoGenerator.from_pretrained(flux2_distilled_dir, device="cpu",
                                       deploy=DeployConfig(offload_idle_expert=True))


def test_fp8_turns_every_block_linear_into_fp8_and_stays_close(flux2_distilled_dir):
    """--fp8 through the denoiser contract (runtime.fp8_denoisers): the double- and single-stream blocks'
    linears become FP8Linear, the image stays close to the full-precision one (measured 65 dB on the demo)."""
    import numpy as np
    import torch

    from vidloom.core.deploy import DeployConfig
    from vidloom.layers.fp8 import FP8Linear

    def run(fp8: bool):
        gen = VideoGenerator.from_pretrained(flux2_distilled_dir, device="cpu", deploy=DeployConfig(fp8_weights=fp8))
        out = gen.generate(prompt="a cat", height=64, width=64, num_inference_steps=2, seed=4)
        return gen, np.asarray(out.frames, dtype=np.float64)

    gen, fp8 = run(True)
    transformer = gen.engine.instance.components["transformer"]
    units = transformer.compile_units()
    assert sum(isinstance(m, FP8Linear) for u in units for m in u.modules()) > 0
    assert not any(type(m) is torch.nn.Linear for u in units for m in u.modules())
    _, plain = run(False)
    mse = float(np.mean((fp8 - plain) ** 2))
    assert 0 < mse and 10 * np.log10(255.0**2 / mse) > 35.0


def test_warmup_shapes_warm_an_image_model_with_text_to_image(flux2_distilled_dir):
    from vidloom.core.deploy import DeployConfig

    gen = VideoGenerator.from_pretrained(flux2_distilled_dir, device="cpu",
                                         deploy=DeployConfig(warmup_shapes=((32, 48, 1),)))
    assert gen.generate("x", height=32, width=48, num_inference_steps=1).frames.shape == (1, 32, 48, 3)
