"""Compiled engines in one process: compiled code never outlives or crosses into another engine's weights.

Serving loads and unloads generators in one process, and dynamo's caches are process-wide (every DiT block shares
its class's code object), so a stale graph or a leaked stance would give one model another's output. Here a
compiled engine runs, then plain and fused engines of other weights; then two compiled engines of different
weights live side by side. Each output must equal the same weights' run before anything was compiled (plain runs
bit for bit; compiled ones within 1e-5, the fused-op difference of the compiled path).
"""

from __future__ import annotations

import gc

import numpy as np
import pytest

from tests.helpers.lora_files import WAN_LORA as SPEC, WAN_LORA_REQUEST as KW, write_lora
from tests.helpers.wan_checkpoints import TINY_A, write_tiny_wan
from vidloom.core.deploy import DeployConfig
from vidloom.generator import VideoGenerator, build_request
from vidloom.runtime.compile_stance import held_stances


@pytest.fixture(scope="module")
def wan(tmp_path_factory):
    folder = write_tiny_wan(tmp_path_factory.mktemp("wan"), TINY_A)
    return folder, write_lora(folder, "WanPipeline", SPEC, tmp_path_factory.mktemp("lora"))


def _load(wan, fused: bool, backend: str | None = None) -> VideoGenerator:
    deploy = DeployConfig(compile=True, compile_backend=backend) if backend else None
    return VideoGenerator.from_pretrained(wan[0], device="cpu", dtype="float32", deploy=deploy,
                                          fuse_loras={"a": (str(wan[1]), 0.9)} if fused else None)


def _frames(gen: VideoGenerator) -> np.ndarray:
    return gen.engine.run(build_request(gen.card, "a kite", **KW))["video"]


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compiled_engines_neither_outlive_nor_cross_into_other_weights(wan, backend):
    base, fused = _frames(_load(wan, False)), _frames(_load(wan, True))
    assert np.abs(base - fused).max() > 1e-2, "the fused adapter must change the frames for this test to mean much"

    compiled = _load(wan, False, backend)
    assert np.allclose(_frames(compiled), base, atol=1e-5)
    assert np.array_equal(_frames(_load(wan, True)), fused), "a plain fused engine beside a live compiled one"
    del compiled
    gc.collect()  # the compiled blocks' ids are free for the next engine's modules
    assert np.array_equal(_frames(_load(wan, True)), fused), "a plain fused engine after a compiled one"

    first, second = _load(wan, False, backend), _load(wan, True, backend)
    assert np.allclose(_frames(first), base, atol=1e-5)
    assert np.allclose(_frames(second), fused, atol=1e-5)
    assert np.allclose(_frames(first), base, atol=1e-5), "the first engine after the second compiled its graphs"
    assert held_stances() == ()
