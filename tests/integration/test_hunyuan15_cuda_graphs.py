"""HunyuanVideo-1.5 under --cuda-graphs (#35): the denoise step reads no value back from the device (the prompts'
token counts are host ints the transformer slices by), so a graph can hold it, and each set of prompt token counts
is its own graph signature: a prompt that tokenizes to counts seen before replays, one with other counts captures.

The step is checked with OpLog (tests/helpers/graph_capturer.py): no `.item()`/`bool(tensor)`, no nonzero, no host
copy, for a request alone (with and without glyph text, with CFG), a batch of two prompts of different lengths
(padded, masked) and an image-to-video meanflow step (its target t a static buffer). The replayed outputs against
the plain run are in test_cuda_graph_families.py; a real capture in tests/gpu/test_cuda_graph_families.py.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from tests.helpers.batched_runs import first_plans
from tests.helpers.graph_capturer import UNCAPTURABLE, OpLog, RecordingCapturer, graphed_generator
from tests.helpers.graph_families import result
from tests.helpers.hunyuan15_checkpoints import write_i2v_pipeline, write_pipeline
from tests.helpers.wan_i2v_checkpoints import make_image
from vidloom.generator import VideoGenerator, build_request
from vidloom.runtime.batching import run_batched

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")
STEPS = 2
GLYPH = dict(prompt='a sign that says "open"', negative_prompt="blurry", seed=1, guidance_scale=5.0)  # 27 + 14 tokens
PLAIN = dict(prompt="a red fox jumps", negative_prompt="dark, low quality", seed=2, guidance_scale=3.0)  # 22, no glyph


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> VideoGenerator:
    folder = tmp_path_factory.mktemp("hunyuan15-graphs") / "p1"
    write_pipeline(folder, "p1")
    return VideoGenerator.from_pretrained(folder, device="cpu")


def _ops(call) -> set[str]:
    with torch.inference_mode(), OpLog() as log:
        call()
    assert any("scaled_dot_product" in op for op in log.ops)  # the forward itself was seen
    return log.ops


def test_a_step_runs_no_op_a_cuda_graph_cannot_hold(plain):
    engine = plain.engine
    requests = [build_request(engine.instance.card, height=32, width=48, num_frames=5, num_inference_steps=STEPS,
                              **fields) for fields in (GLYPH, PLAIN)]
    with first_plans(engine, requests) as plans:
        lengths = {plan.inputs["prompt"].rows[0].text.shape[0] for plan in plans}
        assert len(lengths) == 2 and all(plan.inputs["negative"] is not None for plan in plans)
        for plan in plans:
            ops = _ops(lambda: plan.call(**plan.inputs))
            assert not ops & UNCAPTURABLE, sorted(ops & UNCAPTURABLE)
        # Rows of other lengths, padded and masked from host counts: the stacked step (runtime.batching stacks its
        # inputs, per-request scales included, before the call a graph would hold).
        log, call = OpLog(), plans[0].call

        def logged(**inputs):
            with log:
                return call(**inputs)

        with torch.inference_mode():
            run_batched([dataclasses.replace(plan, call=logged) for plan in plans])
    assert any("scaled_dot_product" in op for op in log.ops)
    assert not log.ops & UNCAPTURABLE, sorted(log.ops & UNCAPTURABLE)


def test_an_image_to_video_meanflow_step_runs_no_op_a_cuda_graph_cannot_hold(tmp_path):
    write_i2v_pipeline(tmp_path, "p2")
    engine = VideoGenerator.from_pretrained(tmp_path, device="cpu").engine
    request = build_request(engine.instance.card, image=[make_image(50, 30, 1)], num_frames=5,
                            num_inference_steps=STEPS, **GLYPH)
    with first_plans(engine, [request]) as (plan,):
        assert plan.inputs["network"].timestep_r is not None and plan.inputs["network"].inputs.image is not None
        ops = _ops(lambda: plan.call(**plan.inputs))
    assert not ops & UNCAPTURABLE, sorted(ops & UNCAPTURABLE)


def test_each_set_of_prompt_token_counts_is_its_own_graph(plain):
    capturer = RecordingCapturer()
    graphed = graphed_generator(plain, capturer)
    shape = dict(height=32, width=48, num_frames=5, num_inference_steps=STEPS)
    same_counts = {**GLYPH, "prompt": 'a sign that says "shut"', "seed": 3}  # 27 + 14 tokens, as GLYPH
    for fields, captures in ((GLYPH, 1), (PLAIN, 2), (same_counts, 2)):
        want, got = result(plain, {**shape, **fields}), result(graphed, {**shape, **fields})
        assert np.array_equal(got, want), fields["prompt"]
        assert capturer.calls == captures, fields["prompt"]
    assert graphed.engine.graph_stats == {"captures": 2, "replays": 3 * STEPS, "fallbacks": 0}
