"""The parity tool on a tiny Wan: `vidloom parity` finds no divergence, and an injected bug is named exactly."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
import torch

from vidloom.cli import main
from vidloom.core.errors import InvalidRequest
from vidloom.core.request import GenerationRequest
from vidloom.generator import VideoGenerator
from vidloom.parity import Reference, ReferenceUnavailable, TapKey, run_parity
from vidloom.parity.reference import family_for

ARGS = ["--height", "32", "--width", "48", "--frames", "5", "--steps", "3", "--guidance", "5", "--seed", "4"]
BUG = 1e-2  # what the injected bug adds: 100x the default atol, far below the output's scale


def test_command_reports_no_divergence(tiny_wan_dir, capsys):
    code = main(["parity", "--model", str(tiny_wan_dir), *ARGS])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "parity: no divergence over" in out
    for step in range(3):  # every step of the run has a row
        assert f"denoise step {step}" in out
    assert "stage decode.video" in out  # the final frames are compared too


def _add_at(block: torch.nn.Module, call: int) -> torch.utils.hooks.RemovableHandle:
    """Make `block` add BUG to its output on its `call`-th forward (counting from 0)."""
    calls = [0]

    def hook(module: torch.nn.Module, args: object, output: torch.Tensor) -> torch.Tensor:
        calls[0] += 1
        return output + BUG if calls[0] - 1 == call else output

    return block.register_forward_hook(hook)


def test_injected_bug_is_named_at_its_block_step_and_call(tiny_wan_dir):
    gen = VideoGenerator.from_pretrained(tiny_wan_dir, device="cpu", dtype=torch.float32)
    request = GenerationRequest(prompt="a fox", height=32, width=48, num_frames=5, num_inference_steps=3,
                                guidance_scale=5.0, seed=4)
    # CFG runs two calls per step (cond, uncond): block 1's fifth forward is step 2's conditional call.
    handle = _add_at(gen.engine.instance["transformer"].blocks[1], call=4)
    try:
        result = run_parity(tiny_wan_dir, request, generator=gen)
    finally:
        handle.remove()
    first = result.report.first_divergence
    assert first is not None, result.report.format()
    assert first.key == TapKey("block", "blocks.1", "denoise", 2, 0), result.report.format()
    assert first.max_abs == pytest.approx(BUG, rel=1e-2)
    text = result.report.format()
    assert "first divergence at denoise step 2 call 0 block blocks.1" in text
    rows = [line for line in text.splitlines() if line.startswith("denoise step")]
    status = {row[:22].strip(): row.rpartition("  ")[2] for row in rows}
    assert status["denoise step 0"] == status["denoise step 1"] == "ok", text
    assert status["denoise step 2"].startswith("DIVERGED"), text


def test_missing_diffusers_is_a_clear_error(tiny_wan_dir, monkeypatch, capsys):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "diffusers" else find_spec(name, *a))
    assert main(["parity", "--model", str(tiny_wan_dir), *ARGS]) == 2
    assert "diffusers is not installed" in capsys.readouterr().err


def test_bad_tap_options_are_refused_by_flag(tiny_wan_dir, capsys):
    assert main(["parity", "--model", str(tiny_wan_dir), "--taps", "block,layers"]) == 2
    assert "error: --taps: unknown kinds ['layers']" in capsys.readouterr().err
    assert main(["parity", "--model", str(tiny_wan_dir), "--tap-steps", "one"]) == 2
    assert "error: --tap-steps: expected step numbers" in capsys.readouterr().err


def test_a_pipeline_without_a_parity_map_is_refused_with_the_known_ones(tmp_path):
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusionPipeline"}))
    with pytest.raises(ReferenceUnavailable, match="no parity map for pipeline 'StableDiffusionPipeline'; known: WanPipeline"):
        family_for(tmp_path)


def test_an_option_the_reference_cannot_take_is_refused_by_name(tiny_wan_dir):
    reference = Reference(pipe=None, family=family_for(tiny_wan_dir), scheduler_config={})
    request = GenerationRequest(prompt="a fox", image="frame.png")  # a T2V folder: no image-to-video
    with pytest.raises(InvalidRequest, match="image: the reference pipeline WanPipeline cannot take it"):
        run_parity(tiny_wan_dir, request, reference=reference, generator=object())


def test_readme_python_example_runs_as_written(tiny_wan_dir, capsys):
    page = (Path(__file__).resolve().parents[2] / "docs" / "correctness.md").read_text()
    [snippet] = [b for b in re.findall(r"```python\n(.*?)```", page, flags=re.S) if "vidloom.parity" in b]
    assert '"path/to/folder"' in snippet
    exec(snippet.replace('"path/to/folder"', repr(str(tiny_wan_dir))), {})
    assert capsys.readouterr().out.startswith("parity: no divergence over")
