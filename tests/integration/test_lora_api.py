"""LoRA through the Python API and the CLI on a tiny Wan2.1: bad input named, bounds, grouping, compile, CLI."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.helpers.lora_files import WAN_LORA as SPEC, WAN_LORA_REQUEST as KW, LoRASpec, write_lora
from tests.helpers.wan_checkpoints import TINY_A, TINY_B, write_tiny_wan
from vidloom import cli
from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import CheckpointError, InvalidRequest
from vidloom.generator import VideoGenerator, build_request
from vidloom.lora.registry import LoRARegistry, resolve_request_loras
from vidloom.media.video import read_video


@pytest.fixture(scope="module")
def wan(tmp_path_factory):
    folder = write_tiny_wan(tmp_path_factory.mktemp("wan"), TINY_A)
    loras = tmp_path_factory.mktemp("loras")
    return folder, write_lora(folder, "WanPipeline", SPEC, loras), loras


@pytest.fixture(scope="module")
def gen(wan):
    return VideoGenerator.from_pretrained(wan[0], device="cpu", max_loras=2)


def _frames(gen, loras=None):
    return gen.engine.run(build_request(gen.card, "a kite", loras=loras, **KW))["video"]


def test_unknown_name_bad_scale_and_too_many_adapters_are_refused_by_name(gen, wan):
    with pytest.raises(InvalidRequest, match=r"loras\[0\].name.*'nope'.*loaded: none"):
        _frames(gen, {"nope": 1.0})
    with pytest.raises(InvalidRequest, match=r"loras\[0\].scale.*finite"):
        _frames(gen, {"a": float("nan")})
    with pytest.raises(InvalidRequest, match="loras.*must map adapter names"):
        gen.generate("a kite", loras=[("a", 1.0)], **KW)
    gen.load_lora("a", wan[1])
    gen.load_lora("b", wan[1])
    gen.load_lora("b", wan[1])  # replacing a resident name needs no free slot
    try:
        with pytest.raises(InvalidRequest, match=r"loras\[1\].name.*'c'"):
            _frames(gen, {"a": 1.0, "c": 1.0})
    finally:
        gen.unload_lora("a")
        gen.unload_lora("b")


def test_past_max_loras_the_least_recently_used_idle_adapter_is_evicted(gen, wan):
    gen.load_lora("a", wan[1])
    gen.load_lora("b", wan[1])
    _frames(gen, {"a": 1.0})  # a is now the most recently used
    gen.load_lora("c", wan[1])
    assert gen.loras == ["a", "c"], "b, the least recently used, goes"
    held = gen.engine.submit(build_request(gen.card, "a kite", loras={"c": 1.0}, **KW))  # a run holds c
    try:
        gen.load_lora("d", wan[1])
        assert gen.loras == ["c", "d"], "a is evicted although c is older in use: a running request holds c"
        second = gen.engine.submit(build_request(gen.card, "a kite", loras={"d": 1.0}, **KW))
        with pytest.raises(InvalidRequest, match="name.*max_loras is 2.*running requests use all"):
            gen.load_lora("e", wan[1])
        second.close()
    finally:
        held.close()
    gen.load_lora("e", wan[1])  # released by close: c (least recently used) goes now
    assert gen.loras == ["d", "e"]
    gen.unload_lora("d")
    gen.unload_lora("e")
    with pytest.raises(InvalidRequest, match="name.*no LoRA adapter 'a'"):
        gen.unload_lora("a")


def test_files_that_do_not_fit_the_model_name_file_and_key(gen, wan, tmp_path):
    tensors = load_file(str(wan[1]))
    stray = {**tensors, "transformer.blocks.0.attn1.norm_q.lora_A.weight": torch.zeros(4, 24),
             "transformer.blocks.0.attn1.norm_q.lora_B.weight": torch.zeros(24, 4)}
    save_file(stray, str(tmp_path / "stray.safetensors"))
    with pytest.raises(CheckpointError, match=r"stray.safetensors.*norm_q.*matches no linear layer"):
        gen.load_lora("stray", tmp_path / "stray.safetensors")
    other = write_lora(write_tiny_wan(tmp_path / "b", TINY_B), "WanPipeline", SPEC, tmp_path)
    with pytest.raises(CheckpointError, match=r"another model"):
        gen.load_lora("other", other)
    with pytest.raises(CheckpointError, match="no such LoRA file"):
        gen.load_lora("missing", tmp_path / "missing.safetensors")
    assert gen.loras == [], "a failed load leaves nothing resident"


def test_family_without_adapters_refuses_them_by_name():
    with pytest.raises(InvalidRequest, match="lora.*'qwen-omni' family"):
        LoRARegistry({}, "qwen-omni", torch.device("cpu"), torch.float32)
    instance = types.SimpleNamespace(card=types.SimpleNamespace(family="qwen-omni"), components={})
    with pytest.raises(InvalidRequest, match="loras.*'qwen-omni' family"):
        resolve_request_loras(instance, (("x", 1.0),))


def test_runs_with_adapters_batch_with_their_adapter_set(gen, wan):
    gen.load_lora("a", wan[1])
    try:
        plain = gen.engine.submit(build_request(gen.card, "a kite", **KW))
        adapted = gen.engine.submit(build_request(gen.card, "a kite", loras={"a": 1.0}, **KW))
        # Both may share a batched forward: each run's adapters go to its own rows (rows_scope); the set is what
        # lora_batching="grouped" keys by.
        assert not plain.intercepted and not adapted.intercepted
        assert plain.adapter_set == () and adapted.adapter_set == (("a", 1.0),)
        plain.close()
        adapted.close()
    finally:
        gen.unload_lora("a")


def test_unloading_mid_run_does_not_change_the_running_request(gen, wan):
    gen.load_lora("a", wan[1])
    expected = _frames(gen, {"a": 1.0})
    run = gen.engine.submit(build_request(gen.card, "a kite", loras={"a": 1.0}, **KW))
    run.step()
    gen.unload_lora("a")  # the run resolved its adapters at start and keeps them
    while not run.step():
        pass
    assert np.array_equal(run.outputs()["video"], expected)
    run.close()


def test_compiled_blocks_run_adapters_eagerly_and_equal_the_plain_path(wan, gen):
    compiled = VideoGenerator.from_pretrained(wan[0], device="cpu", deploy=DeployConfig(compile=True,
                                                                                        compile_backend="eager"))
    gen.load_lora("a", wan[1])
    compiled.load_lora("a", wan[1])
    try:
        # The compiled path itself differs from eager by ~1e-6 (fused ops); adapters must not widen that.
        assert np.allclose(_frames(compiled), _frames(gen), atol=1e-5)
        assert np.allclose(_frames(compiled, {"a": 1.0}), _frames(gen, {"a": 1.0}), atol=1e-5)
        assert not np.allclose(_frames(compiled, {"a": 1.0}), _frames(compiled), atol=1e-2)
    finally:
        gen.unload_lora("a")


def test_cli_lora_flags(wan, tmp_path):
    folder, path, _ = wan
    size = ["--height", "32", "--width", "32", "--frames", "5", "--steps", "2", "--seed", "3", "--device", "cpu"]
    outputs = {}
    for label, flags in {"base": [], "lora": ["--lora", f"{path}:0.9"], "zero": ["--lora", f"{path}:0"]}.items():
        out = tmp_path / f"{label}.mp4"
        assert cli.main(["generate", "--model", str(folder), "--prompt", "a kite", "--output", str(out),
                         *size, *flags]) == 0
        outputs[label] = read_video(out)[0]
    assert np.abs(outputs["lora"].astype(int) - outputs["base"]).max() > 10
    assert np.array_equal(outputs["zero"], outputs["base"])
    assert cli.main(["generate", "--model", str(folder), "--prompt", "x", "--output", str(tmp_path / "x.mp4"),
                     *size, "--lora", str(tmp_path / "none.safetensors")]) != 0


def test_cli_fuse_loras_runs_the_adapters_fused(wan, tmp_path):
    from PIL import Image

    from vidloom.media.output import png_sequence_paths

    folder, path, _ = wan
    size = ["--height", "32", "--width", "32", "--frames", "5", "--steps", "2", "--seed", "3", "--device", "cpu",
            "--dtype", "float32"]
    outputs = {}
    for label, flags in {"base": [], "run-time": ["--lora", f"{path}:0.9"],
                         "fused": ["--lora", f"{path}:0.9", "--fuse-loras"]}.items():
        out = tmp_path / f"{label}.png"  # lossless frames: the fused-vs-run-time bound is the model's, not H.264's
        assert cli.main(["generate", "--model", str(folder), "--prompt", "a kite", "--output", str(out),
                         *size, *flags]) == 0
        outputs[label] = np.stack([np.asarray(Image.open(p).convert("RGB")) for p in png_sequence_paths(out, 5)])
        outputs[label] = outputs[label].astype(int)
    assert np.abs(outputs["run-time"] - outputs["base"]).mean() > 5
    # fp32: fused weights differ from the run-time update by ~1e-6, the frames by ~1e-6 of the [0, 1] range
    # (measured 2.4e-6), so a uint8 value moves by at most one level where it sits at a rounding boundary.
    # (Through mp4 such a one-level change can grow to several levels on a few pixels: H.264 is lossy.)
    assert np.abs(outputs["fused"] - outputs["run-time"]).max() <= 1
    assert cli.main(["generate", "--model", str(folder), "--prompt", "x", "--output", str(tmp_path / "x.mp4"),
                     *size, "--fuse-loras"]) != 0


def test_concurrent_requests_with_different_adapters_each_equal_their_single_runs(gen, wan, tmp_path):
    from vidloom.runtime.async_engine import AsyncEngine
    from vidloom.runtime.results import video_output

    other = write_lora(wan[0], "WanPipeline", LoRASpec(rank=2, alpha=4, targets=("to_k", "to_out.0"), seed=11),
                       tmp_path)
    gen.load_lora("a", wan[1])
    gen.load_lora("b", other)
    sets = [{"a": 1.0}, {"b": 0.7}, None, {"a": 0.5, "b": 1.0}, None]
    requests = [build_request(gen.card, f"a kite {i}", loras=loras, **KW) for i, loras in enumerate(sets)]
    try:
        alone = [video_output(gen.card, gen.engine.run(r)).frames for r in requests]
        engine = AsyncEngine(gen.engine, policy="batch", slots=len(requests), queue_size=8)
        try:
            handles = [engine.submit(r) for r in requests]
            together = [h.wait(120).frames for h in handles]
        finally:
            engine.close()
    finally:
        gen.unload_lora("a")
        gen.unload_lora("b")
    for i, (a, t) in enumerate(zip(alone, together)):
        # The two runs without adapters may share a forward (1 uint8 level of matmul blocking, see test_batching).
        assert np.abs(a.astype(int) - t.astype(int)).max() <= 1, f"request {i} ({sets[i]}) changed when served together"
    assert np.abs(alone[0].astype(int) - alone[2]).max() > 10 and np.abs(alone[0].astype(int) - alone[1]).max() > 10


@pytest.mark.parametrize("lora_batching", ["mixed", "grouped"])
def test_two_requests_with_different_adapters_share_a_forward_and_equal_their_single_runs(gen, wan, tmp_path,
                                                                                          lora_batching):
    from vidloom.runtime.async_engine import AsyncEngine

    other = write_lora(wan[0], "WanPipeline", LoRASpec(rank=2, alpha=4, targets=("to_k", "to_out.0"), seed=12),
                       tmp_path)
    gen.load_lora("a", wan[1])
    gen.load_lora("b", other)
    requests = [build_request(gen.card, "a kite", loras={"a": 0.9}, **KW),
                build_request(gen.card, "a boat", loras={"b": 0.6}, **KW)]
    try:
        alone = [gen.engine.run(r)["video"] for r in requests]
        engine = AsyncEngine(gen.engine, policy="batch", slots=2, queue_size=4, lora_batching=lora_batching)
        try:
            # Both admitted before the worker's first round: their steps are resident together.
            handles = [engine.submit(r, result=lambda out: out["video"]) for r in requests]
            together = [h.wait(120) for h in handles]
            stats = engine.batch_stats
        finally:
            engine.close()
    finally:
        gen.unload_lora("a")
        gen.unload_lora("b")
    # mixed: one forward of both (each adapter on its own rows); grouped: each set alone.
    assert stats["largest_batch"] == (2 if lora_batching == "mixed" else 1), stats
    for a, t in zip(alone, together):
        # fp32; a batch of 2 changes the matmul blocking only (~1e-6, test_batching), not what each row computes.
        assert np.abs(np.asarray(a, dtype=np.float64) - np.asarray(t, dtype=np.float64)).max() < 1e-5
    assert np.abs(np.asarray(alone[0], dtype=np.float64) - np.asarray(together[1], dtype=np.float64)).max() > 1e-2


def test_far_extension_never_reuses_kv_made_under_other_adapters(tmp_path):
    from tests.helpers.far_checkpoints import FAR_A, write_tiny_far

    folder = write_tiny_far(tmp_path / "far", FAR_A)
    lora = write_lora(folder, "AnyFlowFARPipeline", SPEC, tmp_path)
    source_kw = dict(height=32, width=48, num_frames=9, num_inference_steps=2, seed=1)
    extend_kw = dict(num_frames=21, num_inference_steps=2, seed=2)
    kept = VideoGenerator.from_pretrained(folder, device="cpu", deploy=DeployConfig(kv_session_ttl_s=600))
    rebuilt = VideoGenerator.from_pretrained(folder, device="cpu")  # no resident sessions: always rebuilds the KV
    for gen in (kept, rebuilt):
        gen.load_lora("a", lora)
    for source_loras, extend_loras in (({"a": 1.0}, None), (None, {"a": 1.0})):
        sources = [g.generate("a kite", loras=source_loras, **source_kw) for g in (kept, rebuilt)]
        assert np.array_equal(sources[0].frames, sources[1].frames)
        ours, reference = (g.generate("a kite", extend_from=s, loras=extend_loras, **extend_kw).frames
                           for g, s in zip((kept, rebuilt), sources))
        # A resident KV is reused only between runs with the same (no) adapters; else it is rebuilt.
        assert np.array_equal(ours, reference), f"source {source_loras}, extension {extend_loras}"
