"""Cross-request batching of AnyFlow-FAR rollout steps: requests whose steps are at the same chunk position (same
layout, slabs holding the same context) share a forward whatever their prompts, seeds, lengths and guidance scales;
each request's chunk K/V lands in its own slab and its queries read that slab alone (network.FarKVStack).

Float32 tiny checkpoint. A batched step and the single steps differ only by matmul blocking over the batch; on this
config they agree exactly, and the tolerance is the other families' 1e-5 (test_batching.py), here as max abs on the
step output and on the finished rollout's latents.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.helpers.batched_runs import first_plans, serve_batched
from tests.helpers.far_checkpoints import FAR_A, write_tiny_far
from vidloom.core.loop import NETWORK
from vidloom.core.request import GenerationRequest, Task
from vidloom.families.wan_causal.loop import STEP
from vidloom.generator import VideoGenerator
from vidloom.runtime.batching import batch_key, run_batched
from vidloom.runtime.results import video_output

ATOL = 1e-5
SIZE = dict(height=32, width=48, num_inference_steps=2)
# 9 frames: latent chunks (1, 2); 13 frames: (1, 2, 1), so the same layout as 9 frames at chunks 0 and 1.
KINDS = (dict(prompt="a red fox runs over snow", seed=1, guidance_scale=3.0, num_frames=9),
         dict(prompt="a cat sleeps on a roof", seed=2, guidance_scale=4.5, num_frames=9),
         dict(prompt="rain on a window", seed=3, guidance_scale=3.0, num_frames=13))


@pytest.fixture(scope="module")
def far_dir(tmp_path_factory) -> Path:
    return write_tiny_far(tmp_path_factory.mktemp("far-batch") / "far", FAR_A)


@pytest.fixture(scope="module")
def engine(far_dir) -> Any:
    return VideoGenerator.from_pretrained(far_dir, device="cpu").engine


def _requests(**override: Any) -> list[GenerationRequest]:
    return [GenerationRequest(**{**SIZE, **kind, **override}) for kind in KINDS]


def _chunk(plan: Any) -> int | None:
    """The chunk a rollout step generates; None for any other plan (a prefill, a decode)."""
    return plan.inputs[NETWORK].cache_scope if plan.loop == STEP else None


def _advance(run: Any, chunk: int) -> Any:
    """Run `run`'s plans until its next one is a rollout step of `chunk` (its KV prefilled); that plan."""
    while not (run.prepare() and _chunk(run.pending_plan) == chunk):
        run.step()
    return run.pending_plan


def _assert_batched_equals_single(plans: list[Any]) -> None:
    with torch.inference_mode():
        together = run_batched(plans)
        for plan, result in zip(plans, together):
            alone = plan.call(**plan.inputs)
            assert result.shape == alone.shape
            assert float((result - alone).abs().max()) <= ATOL


def test_first_chunk_steps_of_three_requests_share_a_forward(engine):
    with first_plans(engine, _requests()) as plans:
        assert len({batch_key(p) for p in plans}) == 1 and batch_key(plans[0]) is not None
        _assert_batched_equals_single(plans)


def test_steps_after_a_prefill_attend_each_to_its_own_kv(engine):
    # Chunk 1 attends to chunk 0's K/V, different in every request's slab: a batched step that mixed the slabs up
    # would move every request's output.
    runs = [engine.submit(r) for r in _requests()]
    try:
        plans = [_advance(run, 1) for run in runs]
        assert len({batch_key(p) for p in plans}) == 1  # 9 and 13 frames: the same chunk 1
        slabs = [p.inputs[NETWORK].cache for p in plans]
        assert all(s.context_tokens > 0 for s in slabs)
        assert float((slabs[0].keys - slabs[1].keys).abs().max()) > 1e-3  # the contexts really differ
        _assert_batched_equals_single(plans)
    finally:
        for run in runs:
            run.close()


def test_steps_at_different_chunk_positions_or_guidance_do_not_share_a_forward(engine):
    ahead, behind, unguided = (engine.submit(r) for r in
                               (_requests()[0], _requests()[1], _requests(guidance_scale=1.0)[2]))
    try:
        plans = [_advance(ahead, 1), _advance(behind, 0), _advance(unguided, 0)]
        keys = [batch_key(p) for p in plans]
        assert None not in keys and len(set(keys)) == 3  # chunk 1 vs chunk 0; two text rows (CFG) vs one
    finally:
        for run in (ahead, behind, unguided):
            run.close()


def test_an_extension_steps_with_a_new_request_at_the_same_chunk(engine):
    # An extension of a 9-frame video to 21 frames generates chunks 2 and 3 of (1, 2, 2, 1) after its source's KV,
    # rebuilt here (no resident sessions); a new 21-frame request has the same partition, so at chunk 2 both attend
    # to 3 context frames: they stack, each reading its own slab (the extension's holds its source's context).
    source = video_output(engine.instance.card, engine.run(_requests()[0]))
    extension = GenerationRequest(prompt="the fox jumps into a river", extend_from=source.session, num_frames=21,
                                  num_inference_steps=2, seed=7, guidance_scale=3.0)
    runs = [engine.submit(r) for r in (extension, GenerationRequest(**{**SIZE, **KINDS[1], "num_frames": 21}))]
    try:
        plans = [_advance(run, 2) for run in runs]
        assert batch_key(plans[0]) is not None and batch_key(plans[0]) == batch_key(plans[1])
        _assert_batched_equals_single(plans)
    finally:
        for run in runs:
            run.close()


def test_recompute_steps_without_a_kv_cache_stack_too(engine):
    # kv_cache=False: each step re-embeds the request's own context with the chunk (no slab); the views stack alike.
    from vidloom.core.loop import StepPlan
    from vidloom.families.wan_causal.layout import ChunkLayout
    from vidloom.families.wan_causal.loop import FAR_STEP_INPUTS, far_step
    from vidloom.families.wan_causal.network import FarNetwork

    model = engine.instance["transformer"]
    layout = ChunkLayout.for_chunk((1, 2, 2), 2, (4, 6), model.config)
    torch.manual_seed(0)
    plans = [StepPlan(loop=STEP, index=0, total=1, call=far_step, denoiser=FAR_STEP_INPUTS, inputs={
        NETWORK: FarNetwork(model, layout, None, 2), "latents": torch.randn(1, 4, layout.total_frames, 4, 6),
        "t": torch.tensor([0.8 - 0.2 * i]), "r": torch.tensor([0.3]), "guidance_scale": 2.0 + i, "pair": None,
        "text": model.embed_text(torch.randn(2, 8, model.config.wan.text_dim))}) for i in range(2)]
    assert batch_key(plans[0]) is not None and batch_key(plans[0]) == batch_key(plans[1])
    _assert_batched_equals_single(plans)


def _alone(engine: Any, requests: list[GenerationRequest]) -> list[Any]:
    return [video_output(engine.instance.card, engine.run(r)) for r in requests]


def _assert_same_rollouts(got: list[Any], expected: list[Any]) -> None:
    for out, alone in zip(got, expected):
        assert float((out.session.latents - alone.session.latents).abs().max()) <= ATOL
        assert np.abs(out.frames.astype(int) - alone.frames.astype(int)).max() <= 1
        assert "disabled" not in out.metadata  # prefills and decodes run alone without turning batching off


def test_concurrent_requests_give_the_rollouts_they_give_alone(engine):
    requests = _requests()
    expected = _alone(engine, requests)
    got, stats = serve_batched(engine, requests)
    # Per request: 2 steps for each chunk; the 9-frame ones share chunks 0 and 1 with the 13-frame one.
    assert stats["largest_batch"] == 3, stats
    assert stats["forwards"] < stats["request_steps"], stats
    _assert_same_rollouts(got, expected)
    assert float((expected[0].session.latents - expected[1].session.latents).abs().max()) > 1e-2


def test_requests_at_different_chunk_positions_served_together_stay_correct(engine):
    # The image-to-video request starts at chunk 1 (its first chunk is the image's) while the other starts at 0:
    # whatever the rounds manage to stack, each rollout equals its own.
    from tests.helpers.wan_i2v_checkpoints import make_image

    i2v = GenerationRequest(task=Task.I2V, image=np.asarray(make_image(48, 32, 5)), **{**SIZE, **KINDS[2]})
    requests = [_requests()[0], i2v]
    expected = _alone(engine, requests)
    got, _ = serve_batched(engine, requests)
    _assert_same_rollouts(got, expected)


def test_a_request_with_an_adapter_batches_with_one_without(far_dir, tmp_path):
    # The stacked rows are CFG-branch-major ([uncond of each run; cond of each run]), the layout lora_rows_scope
    # repeats per branch: each run's adapter reaches its own rows only.
    from tests.helpers.lora_files import WAN_LORA, write_lora

    gen = VideoGenerator.from_pretrained(far_dir, device="cpu")
    gen.load_lora("a", write_lora(far_dir, "AnyFlowFARPipeline", WAN_LORA, tmp_path))
    plain, adapted = _requests()[0], GenerationRequest(**{**SIZE, **KINDS[1]}, loras=(("a", 1.0),))
    expected = _alone(gen.engine, [plain, adapted])
    got, stats = serve_batched(gen.engine, [plain, adapted])
    assert stats["largest_batch"] == 2, stats
    _assert_same_rollouts(got, expected)
    unadapted = _alone(gen.engine, [_requests()[1]])[0]
    assert float((unadapted.session.latents - expected[1].session.latents).abs().max()) > 1e-2  # the adapter acted
