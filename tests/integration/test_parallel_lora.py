"""LoRA on a multi-device pool (tiny Wan2.1, gloo, float32): adapters loaded, named, evicted, unloaded and fused on
every rank in lockstep give one process's video, survive a pool restart, and are served over HTTP."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import httpx
import numpy as np
import pytest

from tests.helpers.lora_files import WAN_LORA as SPEC, WAN_LORA_REQUEST as KW, write_lora
from tests.helpers.servers import ThreadServer
from tests.helpers.wan_checkpoints import TINY_A, write_tiny_wan
from vidloom.core.errors import CheckpointError, InvalidRequest
from vidloom.core.parallel import ParallelPlan
from vidloom.generator import VideoGenerator
from vidloom.runtime.parallel.worker import PoolOptions
from vidloom.serving.config import ServeConfig

# As tests/integration/test_parallel.py: the exchanges copy values exactly; only the kernels' summation order can
# change with fewer rows per rank (observed 0 here). One misplaced token would be far above this.
FP32_TOL = 1e-5
OPTIONS = PoolOptions(collective_timeout_s=30, check_lockstep=True)


@pytest.fixture(scope="module")
def wan(tmp_path_factory) -> tuple[Path, Path]:
    folder = write_tiny_wan(tmp_path_factory.mktemp("wan"), TINY_A)
    return folder, write_lora(folder, "WanPipeline", SPEC, tmp_path_factory.mktemp("loras"))


@pytest.fixture(scope="module")
def one(wan) -> VideoGenerator:
    gen = VideoGenerator.from_pretrained(wan[0], device="cpu")
    gen.load_lora("a", wan[1])
    return gen


@pytest.fixture(scope="module")
def cfg2(wan) -> Iterator[VideoGenerator]:
    with VideoGenerator.from_pretrained(wan[0], device="cpu", parallel=ParallelPlan(cfg=2), pool_options=OPTIONS,
                                        max_loras=1) as gen:
        yield gen


def _video(gen: VideoGenerator, loras: dict[str, float] | None) -> np.ndarray:
    return gen.generate("a kite", loras=loras, **KW).frames


def test_an_adapter_loaded_on_every_rank_gives_one_processs_video_and_survives_a_restart(one, cfg2, wan):
    base, adapted = _video(one, None), _video(one, {"a": 0.8})
    assert np.abs(base.astype(int) - adapted.astype(int)).max() > 0  # the adapter changes the video
    cfg2.load_lora("a", wan[1])
    assert cfg2.loras == ["a"]
    assert np.array_equal(_video(cfg2, {"a": 0.8}), adapted)
    assert np.array_equal(_video(cfg2, None), base)
    cfg2.engine.restart()  # fresh ranks load the resident adapters again
    assert cfg2.loras == ["a"] and np.array_equal(_video(cfg2, {"a": 0.8}), adapted)
    with pytest.raises(InvalidRequest, match=r"no LoRA adapter 'b' is loaded \(loaded: \['a'\]\)") as err:
        cfg2.generate("a kite", loras={"b": 1.0}, **KW)  # at submit: no rank is contacted
    assert err.value.field == "loras[0].name"
    cfg2.load_lora("b", wan[1])  # max_loras=1: evicts a on every rank, and the mirror says so
    assert cfg2.loras == ["b"]
    with pytest.raises(InvalidRequest, match="no LoRA adapter 'a'"):
        cfg2.generate("a kite", loras={"a": 1.0}, **KW)
    cfg2.unload_lora("b")
    assert cfg2.loras == [] and not cfg2.engine.broken


def test_a_bad_file_fails_on_every_rank_alike_and_leaves_the_pool_working(cfg2, tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match="bad.safetensors"):
        cfg2.load_lora("x", bad)
    with pytest.raises(InvalidRequest, match="no LoRA adapter 'nope'") as err:
        cfg2.unload_lora("nope")
    assert err.value.field == "name" and not cfg2.engine.broken and cfg2.loras == []


def test_fused_adapters_on_a_pool_equal_one_process_fused(wan):
    fused_one = VideoGenerator.from_pretrained(wan[0], device="cpu", fuse_loras={"a": (wan[1], 0.8)})
    expected = _video(fused_one, {"a": 0.8})
    with VideoGenerator.from_pretrained(wan[0], device="cpu", parallel=ParallelPlan(sp=2), pool_options=OPTIONS,
                                        fuse_loras={"a": (wan[1], 0.8)}) as gen:
        assert np.array_equal(_video(gen, {"a": 0.8}), expected)
        with pytest.raises(InvalidRequest, match="fused a:0.8 into its weights") as err:
            gen.generate("a kite", loras={"a": 0.5}, **KW)
        assert err.value.field == "loras"


def test_the_server_loads_lists_and_unloads_adapters_on_the_pool(cfg2, wan):
    config = ServeConfig(data_dir=wan[1].parent / "data", lora_dirs=(wan[1].parent,), graceful_shutdown_s=2)
    with ThreadServer(cfg2.engine, config) as server:  # type: ignore[arg-type]
        with httpx.Client(base_url=server.url, timeout=60) as client:
            loaded = client.post("/v1/loras", json={"name": "ink", "path": wan[1].name})
            assert loaded.status_code == 200, loaded.text
            assert loaded.json()["layers"] > 0
            listed = client.get("/v1/loras").json()
            assert [a["name"] for a in listed["data"]] == ["ink"] and listed["max_loras"] == 1
            assert "ink" in [m["id"] for m in client.get("/v1/models").json()["data"]]
            assert client.delete("/v1/loras/ink").status_code == 200
            assert client.get("/v1/loras").json()["data"] == []
