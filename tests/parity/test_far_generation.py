"""End-to-end parity: vidloom's AnyFlow-FAR rollout vs diffusers' AnyFlowFARPipeline(use_kv_cache=True)."""

from __future__ import annotations

import dataclasses
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.helpers.far_checkpoints import FAR_A, FAR_B, TinyFar, write_tiny_far
from tests.helpers.reference_pipelines import reference_pipeline
from vidloom.core.errors import Cancelled
from vidloom.core.output import ChunkEvent, ProgressEvent
from vidloom.media.frames import to_uint8
from vidloom.core.request import GenerationRequest, Task
from vidloom.generator import VideoGenerator
from vidloom.parity import TapKey, run_parity
from vidloom.families.wan_causal.loop import CHUNK_PHASE, chunk_partition
from vidloom.families.wan_causal.program import build_program
from vidloom.runtime.engine import CancellationToken, Engine

pytest.importorskip("diffusers")
pytestmark = pytest.mark.usefixtures("one_torch_thread")

# fp32 on CPU; observed max diffs 2.5e-6..3.1e-6 (float64 complex RoPE and flex attention
# in the reference vs float32 tables and SDPA here). 1e-4 is the bound.
TOLERANCE = 1e-4
# Cache vs recompute run the same float32 ops over differently shaped attention calls
# (observed <= 2.2e-6 on latents of magnitude ~6-9). CFG at scale g multiplies that
# rounding noise by up to 2g + 1 (observed 1.0e-5 at g = 3), so its bound scales with it.
CACHE_TOLERANCE = 1e-5
PROMPT = "a red fox jumps over a frozen river"
NEGATIVE = "blurred, low quality"

# (spec, request kwargs). Partitions: FAR_A's default (1, 2, 2); FAR_B's default (1, 1, 2, 1);
# FAR_A at 25 frames (7 latent frames) takes the derived partition (1, 2, 2, 2).
CASES: dict[str, tuple[TinyFar, dict[str, Any]]] = {
    "a_wide_no_cfg": (FAR_A, dict(height=48, width=80, num_frames=17, steps=3, guidance=1.0, seed=42)),
    "b_tall_cfg": (FAR_B, dict(height=80, width=48, num_frames=17, steps=2, guidance=3.0, seed=7)),
    "a_derived_partition": (FAR_A, dict(height=64, width=48, num_frames=25, steps=2, guidance=1.0, seed=3)),
}


@pytest.fixture(scope="module")
def far_dirs(tmp_path_factory) -> dict[str, Path]:
    return {spec.name: write_tiny_far(tmp_path_factory.mktemp(spec.name), spec) for spec in (FAR_A, FAR_B)}


def _request(kw: dict[str, Any]) -> GenerationRequest:
    return GenerationRequest(
        prompt=PROMPT, negative_prompt=NEGATIVE, height=kw["height"], width=kw["width"], num_frames=kw["num_frames"],
        num_inference_steps=kw["steps"], guidance_scale=kw["guidance"], seed=kw["seed"],
    )


def _reference(
    folder: Path, partition: tuple[int, ...], kw: dict[str, Any], image: np.ndarray | None = None
) -> np.ndarray:
    from diffusers import AnyFlowFARPipeline

    pipe = reference_pipeline(AnyFlowFARPipeline, folder)
    # I2V input as the pipeline documents it: a (1, 1, 3, H, W) float tensor in [0, 1].
    video = None if image is None else torch.from_numpy(image.astype(np.float32) / 255.0).permute(2, 0, 1)[None, None]
    out = pipe(
        prompt=PROMPT, negative_prompt=NEGATIVE, video=video, height=kw["height"], width=kw["width"],
        num_frames=kw["num_frames"],
        num_inference_steps=kw["steps"], guidance_scale=kw["guidance"], chunk_partition=list(partition),
        generator=torch.Generator("cpu").manual_seed(kw["seed"]), output_type="np", use_kv_cache=True,
    )
    return out.frames[0]


@pytest.mark.parametrize("case", ["b_tall_cfg", "a_derived_partition"])
def test_parity_tool_finds_every_tap_within_tolerance(far_dirs, case):
    """Every step of every chunk (steps count across chunks): each block's output for the [uncond, cond] batch
    and the chunk's latents, then the frames; the reference's KV-cache fills between chunks are not steps."""
    spec, kw = CASES[case]
    result = run_parity(far_dirs[spec.name], _request(kw))
    report = result.report
    assert report.ok, report.format()
    latent_frames = (kw["num_frames"] - 1) // 4 + 1
    chunks = len(chunk_partition(latent_frames, spec.transformer["chunk_partition"]))
    assert sum(d.key.kind == "latents" for d in report.diffs) == chunks * kw["steps"], report.format()
    assert {d.key.call for d in report.diffs if d.key.kind == "block"} == {0}, report.format()  # one batched call
    assert any(d.key.name == "rollout.video" for d in report.diffs), report.format()


def test_parity_tool_names_a_perturbed_block(far_dirs):
    """1e-2 added to block 1 at the second chunk's first step: that tap is the first divergence."""
    spec, kw = CASES["a_wide_no_cfg"]
    kw = {**kw, "steps": 2}
    folder = far_dirs[spec.name]
    generator = VideoGenerator.from_pretrained(folder, device="cpu")
    block = generator.engine.instance["transformer"].blocks[1]
    seen = [0]

    def bump(module, args, output):
        seen[0] += 1
        return output + 1e-2 if seen[0] == 4 else output  # steps 0, 1 of chunk 0, chunk 1's KV prefill, step 2

    handle = block.register_forward_hook(bump)
    try:
        report = run_parity(folder, _request(kw), generator=generator).report
    finally:
        handle.remove()
    first = report.first_divergence
    assert first is not None and first.key == TapKey("block", "blocks.1", "rollout", 2, 0), report.format()
    assert first.max_abs == pytest.approx(1e-2, rel=1e-2)


def _latents_engine(generator: VideoGenerator, kv_cache: bool) -> Engine:
    """An engine whose program stops after the rollout and returns its latents."""
    instance = generator.engine.instance
    return Engine(instance, build_program(instance, kv_cache=kv_cache, decode=False))


@pytest.mark.parametrize("case", list(CASES))
def test_generation_matches_anyflow_far_pipeline(far_dirs, case):
    spec, kw = CASES[case]
    folder = far_dirs[spec.name]
    generator = VideoGenerator.from_pretrained(folder, device="cpu")
    latent_frames = (kw["num_frames"] - 1) // 4 + 1
    partition = chunk_partition(latent_frames, generator.engine.instance["transformer"].config.chunk_partition)
    everything: list = []
    got = generator.engine.run(_request(kw), on_event=everything.append)["video"]
    events = [e for e in everything if isinstance(e, ProgressEvent)]
    expected = _reference(folder, partition, kw)
    assert got.shape == expected.shape == (kw["num_frames"], kw["height"], kw["width"], 3)
    assert expected.std() > 1e-2, "reference video is flat; the test would prove nothing"
    diff = float(np.abs(got - expected).max())
    assert diff <= TOLERANCE, f"{case}: max abs diff {diff:.3e}"

    # One progress event per flow-map step and per chunk, each chunk after its own steps.
    chunks = [e.step for e in events if e.phase == CHUNK_PHASE]
    steps = [e for e in events if e.phase == "rollout"]
    assert chunks == list(range(1, len(partition) + 1))
    assert [e.step for e in steps] == list(range(1, len(partition) * kw["steps"] + 1))
    assert all(e.total == len(partition) * kw["steps"] for e in steps)
    order = [e.phase for e in events if e.phase in (CHUNK_PHASE, "rollout")]
    assert order == (["rollout"] * kw["steps"] + [CHUNK_PHASE]) * len(partition)

    # Each chunk is streamed once decoded, right after its own steps and before the next chunk's;
    # the chunks, in order, are the final video's frames.
    streamed = [e for e in everything if isinstance(e, ChunkEvent)]
    assert [e.chunk.index for e in streamed] == list(range(len(partition)))
    assert all(e.chunk.total == len(partition) and e.fps == 16 for e in streamed)
    assert [e.chunk.start_frame for e in streamed[1:]] == [e.chunk.stop_frame for e in streamed[:-1]]
    assert streamed[-1].chunk.stop_frame == kw["num_frames"]
    assert np.array_equal(np.concatenate([e.chunk.frames for e in streamed]), to_uint8(got))
    kinds = ["chunk" if isinstance(e, ChunkEvent) else e.phase for e in everything
             if isinstance(e, ChunkEvent) or e.phase == "rollout"]
    assert kinds == (["rollout"] * kw["steps"] + ["chunk"]) * len(partition)


ROLLOUT_CASES = {
    "b_no_cfg": (FAR_B, {**CASES["b_tall_cfg"][1], "guidance": 1.0}),
    "a_derived_partition": CASES["a_derived_partition"],
    "b_tall_cfg": CASES["b_tall_cfg"],
}


@pytest.mark.parametrize("case", list(ROLLOUT_CASES))
def test_kv_cache_rollout_equals_recompute(far_dirs, case):
    spec, kw = ROLLOUT_CASES[case]
    generator = VideoGenerator.from_pretrained(far_dirs[spec.name], device="cpu")
    cached = _latents_engine(generator, kv_cache=True).run(_request(kw))["latents"]
    recomputed = _latents_engine(generator, kv_cache=False).run(_request(kw))["latents"]
    assert cached.std() > 0.1
    diff = (cached - recomputed).abs().max().item()
    bound = CACHE_TOLERANCE * (2 * kw["guidance"] + 1 if kw["guidance"] > 1 else 1)
    assert diff <= bound, f"{case}: cache vs recompute max abs diff {diff:.3e}"


def test_cancel_mid_rollout_releases_the_kv_cache(far_dirs, monkeypatch):
    spec, kw = CASES["b_tall_cfg"]
    generator = VideoGenerator.from_pretrained(far_dirs[spec.name], device="cpu")
    transformer = generator.engine.instance["transformer"]
    caches: list[weakref.ref] = []
    allocate = transformer.new_cache

    def tracked(*args, **kwargs):
        cache = allocate(*args, **kwargs)
        caches.append(weakref.ref(cache))
        return cache

    monkeypatch.setattr(transformer, "new_cache", tracked)
    token = CancellationToken()

    def cancel_in_chunk_two(event):
        if isinstance(event, ProgressEvent) and event.phase == "kv_prefill":
            assert caches and caches[0]() is not None  # held while the rollout runs
            token.cancel()

    manager = generator.engine.caches
    with pytest.raises(Cancelled):
        generator.engine.run(_request(kw), on_event=cancel_in_chunk_two, cancel=token)
    assert len(caches) == 1 and caches[0]() is None, "the cancelled request's KV slab is still referenced"
    assert manager.stats()["bytes_in_use"] == 0 and manager.stats()["handles"] == 0
    generator.engine.run(_request(kw))
    assert len(caches) == 2 and caches[1]() is None, "a finished request's KV slab is still referenced"
    assert manager.bytes_in_use == 0


def test_kv_cache_budget_is_checked_before_the_first_step(far_dirs):
    from vidloom.core.deploy import DeployConfig
    from vidloom.core.errors import CacheBudgetExceeded

    spec, kw = CASES["a_wide_no_cfg"]
    generator = VideoGenerator.from_pretrained(far_dirs[spec.name], device="cpu",
                                               deploy=DeployConfig(kv_cache_budget_bytes=4096))
    events: list[ProgressEvent] = []
    with pytest.raises(CacheBudgetExceeded, match="kv_cache_budget_bytes=4096") as err:
        generator.engine.run(_request(kw), on_event=events.append)
    assert not [e for e in events if getattr(e, "phase", "") == "rollout"], "failed mid-rollout instead of before it"
    assert generator.engine.caches.bytes_in_use == 0
    # A budget that fits this request's slab exactly admits it and gets every byte back.
    fitting = VideoGenerator.from_pretrained(far_dirs[spec.name], device="cpu",
                                             deploy=DeployConfig(kv_cache_budget_bytes=err.value.needed))
    seen: list[int] = []
    fitting.engine.run(_request(kw), on_event=lambda e: seen.append(fitting.engine.caches.bytes_in_use))
    assert max(seen) == err.value.needed and fitting.engine.caches.bytes_in_use == 0


def test_generate_api_returns_the_rollout_video(far_dirs):
    spec, kw = CASES["a_wide_no_cfg"]
    generator = VideoGenerator.from_pretrained(far_dirs[spec.name], device="cpu")
    video = generator.generate(
        PROMPT, negative_prompt=NEGATIVE, height=kw["height"], width=kw["width"], num_frames=kw["num_frames"],
        num_inference_steps=kw["steps"], seed=kw["seed"],
    )
    assert generator.card.family == "anyflow-far"
    assert video.frames.shape == (kw["num_frames"], kw["height"], kw["width"], 3)
    assert video.metadata["sampler"] == "flow_map_euler" and video.metadata["guidance_scale"] == 1.0
    frames = generator.engine.run(_request(kw))["video"]
    assert np.abs(video.frames.astype(np.float32) / 255 - frames).max() <= 1 / 255 + 1e-6


def _image(kw: dict[str, Any], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    # A smooth gradient plus noise: structure the VAE keeps, so the first frame is recognisable.
    ys, xs = np.mgrid[0 : kw["height"], 0 : kw["width"]]
    base = np.stack([ys / kw["height"], xs / kw["width"], 0.5 + 0 * xs], axis=-1)
    return np.clip((base * 0.8 + rng.random(base.shape) * 0.2) * 255, 0, 255).astype(np.uint8)


def _i2v_case(far_dirs: dict[str, Path], case: str,
              seed: int) -> tuple[dict[str, Any], Path, VideoGenerator, np.ndarray]:
    """A case's request settings, its checkpoint folder loaded, and a first frame drawn with `seed`."""
    spec, kw = CASES[case]
    folder = far_dirs[spec.name]
    return kw, folder, VideoGenerator.from_pretrained(folder, device="cpu"), _image(kw, seed=seed)


@pytest.mark.parametrize("case", ["a_wide_no_cfg", "b_tall_cfg"])
def test_i2v_matches_anyflow_far_pipeline(far_dirs, case):
    kw, folder, generator, image = _i2v_case(far_dirs, case, seed=11)
    partition = generator.engine.instance["transformer"].config.chunk_partition
    everything: list = []
    got = generator.generate(
        PROMPT, negative_prompt=NEGATIVE, image=image, num_frames=kw["num_frames"],
        num_inference_steps=kw["steps"], guidance_scale=kw["guidance"], seed=kw["seed"], on_event=everything.append,
    )
    events = [e for e in everything if isinstance(e, ProgressEvent)]
    expected = _reference(folder, partition, kw, image=image)
    assert got.metadata["task"] == "i2v" and got.frames.shape == expected.shape[:1] + (kw["height"], kw["width"], 3)
    diff = float(np.abs(got.frames.astype(np.float32) / 255 - expected).max())
    assert diff <= 1 / 255 + TOLERANCE, f"{case}: max abs diff {diff:.3e} (uint8 frames)"
    # The first chunk is the image's: never denoised, so the steps cover the other chunks only.
    steps = [e for e in events if e.phase == "rollout"]
    assert len(steps) == (len(partition) - 1) * kw["steps"]
    assert [e.step for e in events if e.phase == CHUNK_PHASE] == list(range(2, len(partition) + 1))
    # The image's own chunk streams first (its reconstruction), then each generated one.
    streamed = [e.chunk for e in everything if isinstance(e, ChunkEvent)]
    assert [c.index for c in streamed] == list(range(len(partition))) and streamed[0].frames.shape[0] == 1
    assert np.array_equal(np.concatenate([c.frames for c in streamed]), got.frames)
    # And the image matters: the same request as T2V is a different video.
    t2v = generator.engine.run(_request(kw))["video"]
    assert np.abs(t2v - expected).max() > 0.1
    # The engine's float frames (before the uint8 cut) match the same reference run at the float tolerance.
    floats = generator.engine.run(dataclasses.replace(_request(kw), task=Task.I2V, image=image))["video"]
    diff = float(np.abs(floats - expected).max())
    assert diff <= TOLERANCE, f"{case}: float frames max abs diff {diff:.3e}"


# A 5-frame clip is 2 latent frames. FAR_B (1, 1, 2, 1): the first two chunks are context,
# chunks 2 and 3 are generated. FAR_A (1, 2, 2): the clip reaches into chunk 1, so chunks 0
# and 1 are context (chunk 1's second frame stays zero, as in the reference), chunk 2 generated.
V2V_CASES = {"b_tall_cfg": 2, "a_wide_no_cfg": 1}


@pytest.mark.parametrize("case", list(V2V_CASES))
def test_v2v_continuation_matches_anyflow_far_pipeline(far_dirs, case):
    spec, kw = CASES[case]
    folder = far_dirs[spec.name]
    generator = VideoGenerator.from_pretrained(folder, device="cpu")
    partition = generator.engine.instance["transformer"].config.chunk_partition
    clip = np.stack([np.roll(_image(kw, seed=20), shift * 3, axis=1) for shift in range(5)])
    from diffusers import AnyFlowFARPipeline

    pipe = reference_pipeline(AnyFlowFARPipeline, folder)
    expected = pipe(
        prompt=PROMPT, negative_prompt=NEGATIVE, video=torch.from_numpy(clip.astype(np.float32) / 255).permute(0, 3, 1, 2)[None],
        height=kw["height"], width=kw["width"], num_frames=kw["num_frames"], num_inference_steps=kw["steps"],
        guidance_scale=kw["guidance"], chunk_partition=list(partition),
        generator=torch.Generator("cpu").manual_seed(kw["seed"]), output_type="np", use_kv_cache=True,
    ).frames[0]
    events: list = []
    request = dataclasses.replace(_request(kw), task=Task.V2V, video=clip)
    got = generator.engine.run(request, on_event=events.append)["video"]
    progress = [e for e in events if isinstance(e, ProgressEvent)]
    diff = float(np.abs(got - expected).max())
    assert diff <= TOLERANCE, f"{case}: max abs diff {diff:.3e}"
    assert len([e for e in progress if e.phase == "rollout"]) == V2V_CASES[case] * kw["steps"]  # generated chunks only
    # The context chunks stream too (their reconstruction), so the chunks still cover the whole video.
    streamed = [e.chunk for e in events if isinstance(e, ChunkEvent)]
    assert [c.index for c in streamed] == list(range(len(partition)))
    assert np.array_equal(np.concatenate([c.frames for c in streamed]), to_uint8(got))
    # The public API takes the clip as a list of frames and gives the same video.
    video = generator.generate(PROMPT, negative_prompt=NEGATIVE, video=list(clip), num_frames=kw["num_frames"],
                               num_inference_steps=kw["steps"], guidance_scale=kw["guidance"], seed=kw["seed"])
    assert video.metadata["task"] == "v2v"
    assert np.abs(video.frames.astype(np.float32) / 255 - got).max() <= 1 / 255 + 1e-6


def test_generate_stream_yields_chunks_while_the_rollout_runs(far_dirs):
    spec, kw = CASES["a_derived_partition"]
    generator = VideoGenerator.from_pretrained(far_dirs[spec.name], device="cpu")
    fields = dict(height=kw["height"], width=kw["width"], num_frames=kw["num_frames"],
                  num_inference_steps=kw["steps"], seed=kw["seed"])
    steps_seen: list[int] = []
    chunks = []
    for event in generator.generate_stream(
        PROMPT, negative_prompt=NEGATIVE, **fields,
        on_event=lambda e: isinstance(e, ProgressEvent) and e.phase == "rollout" and steps_seen.append(e.step),
    ):
        chunks.append((event, len(steps_seen)))
    # Chunk k arrives after exactly its own steps, not at the end of the run.
    assert [done for _, done in chunks] == [kw["steps"] * (k + 1) for k in range(len(chunks))]
    whole = generator.generate(PROMPT, negative_prompt=NEGATIVE, **fields)
    assert np.array_equal(np.concatenate([e.chunk.frames for e, _ in chunks]), whole.frames)
    assert chunks[-1][0].seconds()[1] == pytest.approx(kw["num_frames"] / 16)


@pytest.mark.parametrize("case", ["b_tall_cfg", "a_derived_partition"])
def test_chunk_by_chunk_decode_equals_whole_latent_decode(far_dirs, case):
    # The loop decodes each chunk as it finishes, carrying the VAE's causal state across chunks;
    # decoding the finished latents in one call must give the same frames, bit for bit.
    spec, kw = CASES[case]
    generator = VideoGenerator.from_pretrained(far_dirs[spec.name], device="cpu")
    vae = generator.engine.instance["vae"]
    out = generator.engine.run(_request(kw))
    streamed, latents = out["video"], out["session"]["latents"]  # the same run's finished latents
    with torch.no_grad():
        whole = vae.decode(vae.denormalize_latents(latents))
    frames = (whole[0].float() * 0.5 + 0.5).clamp(0, 1).permute(1, 2, 3, 0).numpy()
    assert frames.shape == streamed.shape and frames.std() > 1e-2
    assert np.array_equal(streamed, frames)


def test_streamed_chunks_are_the_saved_mp4s_frames(far_dirs, tmp_path):
    from vidloom.media.video import read_video

    spec, kw = CASES["b_tall_cfg"]
    generator = VideoGenerator.from_pretrained(far_dirs[spec.name], device="cpu")
    fields = dict(negative_prompt=NEGATIVE, height=kw["height"], width=kw["width"], num_frames=kw["num_frames"],
                  num_inference_steps=kw["steps"], guidance_scale=kw["guidance"], seed=kw["seed"])
    chunks = [event.chunk for event in generator.generate_stream(PROMPT, **fields)]
    streamed = np.concatenate([c.frames for c in chunks])
    video = generator.generate(PROMPT, **fields)
    assert np.array_equal(streamed, video.frames)
    decoded, fps = read_video(video.save(tmp_path / "far.mp4"))
    assert decoded.shape == streamed.shape == (kw["num_frames"], kw["height"], kw["width"], 3)
    assert fps == 16
    # H.264 is lossy (~22 dB on these noisy frames), but each decoded frame is still nearest
    # to its own streamed frame: a dropped, repeated or reordered chunk would break that.
    flat = [f.reshape(len(f), -1).astype(np.float32) for f in (decoded, streamed)]
    distance = np.abs(flat[0][:, None, :] - flat[1][None, :, :]).mean(-1)
    assert list(distance.argmin(axis=1)) == list(range(len(streamed)))


def test_stopping_a_stream_early_releases_its_kv_cache(far_dirs):
    spec, kw = CASES["a_derived_partition"]
    generator = VideoGenerator.from_pretrained(far_dirs[spec.name], device="cpu")
    stream = generator.generate_stream(PROMPT, height=kw["height"], width=kw["width"],
                                       num_frames=kw["num_frames"], num_inference_steps=kw["steps"], seed=1)
    first = next(stream)
    assert first.chunk.index == 0 and generator.engine.caches.bytes_in_use > 0
    stream.close()
    assert generator.engine.caches.bytes_in_use == 0


def test_memory_estimate_counts_the_exact_kv_slab(far_dirs):
    from vidloom.media.request_inputs import resolve_request
    from vidloom.families.wan_causal.memory import estimate_request_bytes, kv_cache_bytes

    spec, kw = CASES["b_tall_cfg"]
    generator = VideoGenerator.from_pretrained(far_dirs[spec.name], device="cpu")
    instance = generator.engine.instance
    request = resolve_request(_request(kw), instance.card)
    held: list[int] = []
    generator.engine.run(_request(kw), on_event=lambda e: held.append(generator.engine.caches.bytes_in_use))
    assert kv_cache_bytes(instance, request) == max(held) > 0  # what the manager accounted, exactly
    assert generator.engine.estimator is not None
    assert estimate_request_bytes(instance, request) > kv_cache_bytes(instance, request)
    # More frames: more chunks, a bigger slab, a bigger estimate.
    longer = dataclasses.replace(request, num_frames=41)
    assert kv_cache_bytes(instance, longer) > kv_cache_bytes(instance, request)
    assert generator.engine.estimator(longer) > generator.engine.estimator(request)
