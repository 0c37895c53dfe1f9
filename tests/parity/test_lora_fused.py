"""Fused LoRA mode vs the run-time path and vs diffusers' fuse_lora, same seed, tiny Wan2.1 and Flux2 Klein.

Two adapters mixed at scales (one negative) are fused at load (`from_pretrained(fuse_loras=...)`); the frames
must equal the run-time adapters' and diffusers' `set_adapters(weights)` + `fuse_lora()` within 1e-4 (fp32), the
fused model must hold no adapter tensors and no wrapper, and the run-time operations must be refused by name.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.lora_files import write_lora
from tests.helpers.reference_pipelines import reference_pipeline
from tests.parity.test_lora_generation import FAMILIES, MIN_EFFECT, PROMPT
from vidloom.core.errors import DeployError, InvalidRequest
from vidloom.generator import VideoGenerator, build_request
from vidloom.lora.apply import LoRALinear
from vidloom.lora.registry import LORA_SLOT

# fp32: fusing changes the order of the additions (W x + s B A x -> (W + s B A) x), ~1e-6 on these sizes; the
# same 1e-4 bound as the run-time parity holds, far inside one uint8 level (3.9e-3).
TOLERANCE = 1e-4
SCALES = (0.8, -0.5)


@pytest.fixture(scope="module", params=["wan", "flux2"])
def family(request, tmp_path_factory):
    write, pipeline, specs, reference, kw = FAMILIES[request.param]
    folder = write(tmp_path_factory.mktemp(request.param))
    files = {name: write_lora(folder, pipeline, spec, tmp_path_factory.mktemp("loras")) for name, spec in specs.items()}
    fused = {name: (path, scale) for (name, path), scale in zip(files.items(), SCALES)}
    return folder, pipeline, files, fused, reference, kw


def _frames(gen: VideoGenerator, kw: dict, loras: dict | None = None) -> np.ndarray:
    return gen.engine.run(build_request(gen.card, PROMPT, loras=loras, **kw))["video"]


def test_fused_equals_run_time_and_diffusers_fuse_lora(family):
    import diffusers

    folder, pipeline, files, fused, reference, kw = family
    runtime = VideoGenerator.from_pretrained(folder, device="cpu")
    for name, path in files.items():
        runtime.load_lora(name, path)
    mixed = dict(zip(files, SCALES))
    expected = _frames(runtime, kw, mixed)
    base = _frames(runtime, kw)
    assert np.abs(expected - base).max() > MIN_EFFECT, "the adapters barely change the output: parity proves nothing"

    gen = VideoGenerator.from_pretrained(folder, device="cpu", fuse_loras=fused)
    out = _frames(gen, kw)
    assert np.abs(out - expected).max() < TOLERANCE

    pipe = reference_pipeline(getattr(diffusers, pipeline), folder)
    for name, path in files.items():
        pipe.load_lora_weights(str(path), adapter_name=name)
    pipe.set_adapters(list(files), adapter_weights=list(SCALES))
    pipe.fuse_lora()
    pipe.unload_lora_weights()  # after fuse_lora: the merged weights stay, the LoRA layers go
    assert np.abs(out - reference(pipe)).max() < TOLERANCE

    # No resident adapter memory and no wrapper: the adapter cache is empty, every linear is the plain one.
    registry = gen.engine.instance.components[LORA_SLOT]
    assert registry.adapters == [] and gen.loras == []
    assert [f.name for f in registry.fused] == list(files) and [f.scale for f in registry.fused] == list(SCALES)
    assert not any(isinstance(m, LoRALinear) for m in gen.engine.instance.components["transformer"].modules())

    # The fused set itself may be named (it is what runs); anything else is refused naming `loras`.
    assert np.array_equal(_frames(gen, kw, mixed), out)
    first = next(iter(files))
    for other in ({first: SCALES[0]}, {**mixed, first: 1.0}, {"other": 1.0}):
        with pytest.raises(InvalidRequest, match="loras.*fused") as caught:
            _frames(gen, kw, other)
        assert caught.value.field == "loras"
    with pytest.raises(InvalidRequest, match="fuse_loras.*cannot load"):
        gen.load_lora("late", files[first])
    with pytest.raises(InvalidRequest, match="fuse_loras.*cannot unload"):
        gen.unload_lora(first)


def test_fused_runs_take_the_compiled_and_batched_paths(family):
    from vidloom.core.deploy import DeployConfig

    folder, _, _, fused, _, kw = family
    eager = VideoGenerator.from_pretrained(folder, device="cpu", fuse_loras=fused)
    compiled = VideoGenerator.from_pretrained(folder, device="cpu", fuse_loras=fused,
                                              deploy=DeployConfig(compile=True, compile_backend="eager"))
    run = compiled.engine.submit(build_request(compiled.card, PROMPT, **kw))
    try:
        # No per-request adapters: the run is not forced eager, nor kept out of batched forwards.
        assert run._loras is None and not run.intercepted
    finally:
        run.close()
    assert np.allclose(_frames(compiled, kw), _frames(eager, kw), atol=1e-5)


def test_bad_fuse_requests_are_refused_by_name(family, tmp_path):
    folder, _, files, _, _, _ = family
    name, path = next(iter(files.items()))
    with pytest.raises(InvalidRequest, match="loras.*finite"):
        VideoGenerator.from_pretrained(folder, device="cpu", fuse_loras={name: (path, float("inf"))})
    from vidloom.core.errors import CheckpointError

    with pytest.raises(CheckpointError, match="no such LoRA file"):
        VideoGenerator.from_pretrained(folder, device="cpu", fuse_loras={name: tmp_path / "none.safetensors"})


def test_fp8_layers_are_refused_before_any_weight_changes(family):
    from vidloom.layers.fp8 import FP8Linear
    from vidloom.lora.fuse import fuse_adapters
    from vidloom.lora.registry import read_adapter

    folder, _, files, fused, _, _ = family
    gen = VideoGenerator.from_pretrained(folder, device="cpu")
    instance = gen.engine.instance
    name, path = next(iter(files.items()))
    # The file's last layer: the others would be changed first if the check did not come before any change.
    key = list(read_adapter(name, path, instance.components, instance.card.family, instance.device,
                            torch.float32).layers)[-1]
    component, _, module = key.partition(":")
    parent, _, attr = module.rpartition(".")
    owner = instance.components[component].get_submodule(parent)
    setattr(owner, attr, FP8Linear.from_linear(getattr(owner, attr)))
    before = {k: v.clone() for k, v in instance.components[component].state_dict().items()}
    with pytest.raises(DeployError, match=rf"fuse_loras: {component}\.{module} is a FP8Linear"):
        fuse_adapters(instance, fused)
    after = instance.components[component].state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before), "a refused fuse must leave the weights as they were"
    assert instance.components[LORA_SLOT].fused == ()
