"""Cross-request batching (AsyncEngine policy "batch"): shared forwards give each request its own result."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from vidloom.core.errors import Cancelled
from vidloom.core.output import ProgressEvent
from vidloom.core.request import GenerationRequest, Task
from vidloom.generator import VideoGenerator
from vidloom.runtime.async_engine import AsyncEngine
from vidloom.runtime.batching import batch_key, run_batched

# Batched vs single forwards differ only by matmul blocking over the batch: observed up to 2e-6 of the
# fp32 step output's magnitude (CFG's scale amplifies it), so 1e-5 relative to the output's max.
# On uint8 images that can flip a rounding, hence 1 level there.
STEP_RTOL = 1e-5
UINT8_TOLERANCE = 1


@pytest.fixture(scope="module")
def klein(flux2_distilled_dir):
    return VideoGenerator.from_pretrained(flux2_distilled_dir, device="cpu").engine


@pytest.fixture(scope="module")
def klein_base(tiny_flux2_dir):
    return VideoGenerator.from_pretrained(tiny_flux2_dir, device="cpu").engine


@pytest.fixture(scope="module")
def wan(demo_cache):
    return VideoGenerator.from_pretrained("wan2.1-demo", device="cpu", cache_dir=demo_cache).engine


def _flux_requests() -> list[GenerationRequest]:
    prompts = ["a red fox", "a cat holding a sign", "a bowl of fruit", "an astronaut"]
    return [GenerationRequest(prompt=p, task=Task.T2I, height=32, width=48, num_inference_steps=steps, seed=seed)
            for p, steps, seed in zip(prompts, (2, 3, 2, 4), (1, 2, 3, 4))]


def _wan_requests() -> list[GenerationRequest]:
    return [GenerationRequest(prompt=p, height=32, width=48, num_frames=5, num_inference_steps=steps, seed=seed,
                              guidance_scale=g)
            for p, steps, seed, g in zip(["a fox", "a cat", "a boat", "rain"], (2, 3, 2, 3), (1, 2, 3, 4),
                                         (5.0, 5.0, 3.0, 5.0))]


def _alone(engine, requests):
    from vidloom.runtime.results import video_output

    return [video_output(engine.instance.card, engine.run(r)).frames for r in requests]


def _batched(engine, requests, **kw):
    async_engine = AsyncEngine(engine, policy="batch", slots=len(requests), queue_size=8, **kw)
    try:
        handles = [async_engine.submit(r) for r in requests]
        return [h.wait(120).frames for h in handles], async_engine.batch_stats
    finally:
        async_engine.close()


@pytest.mark.parametrize("family", ["flux2", "wan"])
def test_four_concurrent_requests_give_the_images_they_give_alone(family, request):
    engine = request.getfixturevalue("klein" if family == "flux2" else "wan")
    requests = _flux_requests() if family == "flux2" else _wan_requests()
    expected = _alone(engine, requests)
    got, stats = _batched(engine, requests)
    assert stats["mean_batch"] > 1.5  # steps really were shared
    for e, g in zip(expected, got):
        assert np.abs(e.astype(int) - g.astype(int)).max() <= UINT8_TOLERANCE


def test_a_cancelled_member_leaves_the_others_untouched(klein):
    requests = _flux_requests()
    expected = _alone(klein, requests)
    async_engine = AsyncEngine(klein, policy="batch", slots=4, queue_size=8)
    victim = requests[3].request_id
    cancelled = threading.Event()

    def on_event(event):  # cancel the 4-step request after its first step, while the others still run
        if isinstance(event, ProgressEvent) and event.request_id == victim and event.phase == "denoise":
            if not cancelled.is_set():
                cancelled.set()
                async_engine.cancel(victim)

    try:
        handles = [async_engine.submit(r, on_event if r.request_id == victim else None) for r in requests]
        for i, handle in enumerate(handles[:3]):
            assert np.abs(expected[i].astype(int) - handle.wait(120).frames.astype(int)).max() <= UINT8_TOLERANCE
        with pytest.raises(Cancelled):
            handles[3].wait(120)
    finally:
        async_engine.close()


def test_batched_step_equals_single_steps_with_per_sample_guidance(klein_base):
    # Direct check at the step level, on both tiny configs, CFG on with different scales per request.
    runs = [klein_base.submit(GenerationRequest(prompt=p, task=Task.T2I, height=32, width=48, num_inference_steps=n,
                                               seed=s, guidance_scale=g))
            for p, n, s, g in (("a fox", 2, 1, 3.0), ("a cat", 3, 2, 5.0), ("rain", 2, 3, 1.0))]
    try:
        plans = []
        for run in runs:
            assert run.prepare() is False  # encode_text ran
            while not run.prepare():
                pass
            plans.append(run.pending_plan)
        keys = {batch_key(p) for p in plans}
        distilled = bool(klein_base.instance["distilled"])
        # CFG on and off never share a forward (different input structure); a distilled model has no CFG.
        assert len(keys) == (1 if distilled else 2)
        groups: dict = {}
        for plan in plans:
            groups.setdefault(batch_key(plan), []).append(plan)
        with torch.inference_mode():
            for group in groups.values():
                together = run_batched(group)
                for plan, result in zip(group, together):
                    alone = plan.call(**plan.inputs)
                    assert (result - alone).abs().max() <= STEP_RTOL * alone.abs().max()
    finally:
        for run in runs:
            run.close()


def test_a_failing_shared_forward_falls_back_to_single_steps(klein, monkeypatch):
    import vidloom.runtime.worker_rounds as worker_rounds_module

    def broken(plans):
        raise RuntimeError("simulated kernel failure on the stacked batch")

    monkeypatch.setattr(worker_rounds_module, "run_batched", broken)
    requests = _flux_requests()[:2]
    expected = _alone(klein, requests)
    got, stats = _batched(klein, requests)
    assert stats["largest_batch"] == 1  # every step ran alone after the shared forward failed
    for e, g in zip(expected, got):
        assert np.array_equal(e, g)  # alone is exactly the unbatched path


def _i2v_requests() -> list[GenerationRequest]:
    from tests.helpers.wan_i2v_checkpoints import make_image

    return [GenerationRequest(prompt=p, task=Task.I2V, image=np.asarray(make_image(32, 32, seed)), height=32,
                              width=32, num_frames=5, num_inference_steps=steps, seed=seed, guidance_scale=g)
            for p, steps, seed, g in zip(["a fox", "a cat", "a boat"], (2, 3, 2), (1, 2, 3), (5.0, 3.0, 5.0))]


@pytest.mark.parametrize("cfg_mode", ["sequential", "batched"])
def test_wan_image_to_video_requests_batch_each_with_its_own_image(tmp_path_factory, cfg_mode):
    # Each request's CLIP tokens are bound to a network view of its own; the views stack (their tokens in
    # request order, repeated per CFG branch), so requests with different first frames share forwards.
    from tests.helpers.wan_checkpoints import TINY_A
    from tests.helpers.wan_i2v_checkpoints import write_tiny_wan_i2v
    from vidloom.core.deploy import DeployConfig

    folder = write_tiny_wan_i2v(tmp_path_factory.mktemp("i2v-batch"), TINY_A)
    engine = VideoGenerator.from_pretrained(folder, device="cpu", deploy=DeployConfig(cfg_mode=cfg_mode)).engine
    requests = _i2v_requests()
    expected = _alone(engine, requests)
    got, stats = _batched(engine, requests)
    assert stats["mean_batch"] > 1.5
    for e, g in zip(expected, got):
        assert np.abs(e.astype(int) - g.astype(int)).max() <= UINT8_TOLERANCE
    assert any(not np.array_equal(expected[0], e) for e in expected[1:])  # the images really differ per request


def test_offloaded_two_expert_requests_batch(tmp_path_factory):
    from tests.helpers.wan22_checkpoints import write_tiny_a14b
    from tests.helpers.wan_checkpoints import TINY_A
    from vidloom.core.deploy import DeployConfig

    folder = write_tiny_a14b(tmp_path_factory.mktemp("a14b-batch"), TINY_A)
    engine = VideoGenerator.from_pretrained(folder, device="cpu", deploy=DeployConfig(offload_idle_expert=True)).engine
    requests = _wan_requests()[:3]
    expected = _alone(engine, requests)
    got, stats = _batched(engine, requests)
    assert stats["mean_batch"] > 1.5
    for e, g in zip(expected, got):
        assert np.abs(e.astype(int) - g.astype(int)).max() <= UINT8_TOLERANCE
