"""HunyuanVideo-1.5 under --cuda-graphs (#35): the denoise step reads no value back from the device, so a graph can
hold it. Eager, the prompts are unpadded and the transformer slices them by their token counts (host ints); under
graphs each CFG branch's text and glyph tokens are padded to their prompt-length buckets (text.bucketed,
runtime.prompt_buckets.PROMPT_BUCKET = 64), the valid counts a tensor input, the padding keys masked: a prompt of
another length in the same buckets replays, one in another bucket captures anew.

The graphed step sums the same condition keys as the eager one in another order: the bound is 1e-5 absolute on the
decoded float32 video (measured: max abs 2.1e-6 over GLYPH, OTHER, LONG and PLAIN, T2V and meanflow I2V).

The step is checked with OpLog (tests/helpers/graph_capturer.py): no `.item()`/`bool(tensor)`, no nonzero, no host
copy, eager and bucket-padded, for a request alone (with and without glyph text, with CFG), a batch of two prompts of
different lengths (padded, masked) and an image-to-video meanflow step (its target t a static buffer). The replayed
outputs against the plain run are also in test_cuda_graph_families.py; a real capture in
tests/gpu/test_cuda_graph_families.py.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from tests.helpers.batched_runs import first_plans
from tests.helpers.graph_capturer import UNCAPTURABLE, OpLog, RecordingCapturer, graphed_generator
from tests.helpers.hunyuan15_checkpoints import write_i2v_pipeline, write_pipeline
from tests.helpers.wan_i2v_checkpoints import make_image
from vidloom.core.request import resolve_request
from vidloom.families.hunyuan15.memory import footprint
from vidloom.generator import VideoGenerator, build_request
from vidloom.runtime.batching import run_batched
from vidloom.runtime.prompt_buckets import PROMPT_BUCKET, bucket_length

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")
STEPS = 2
VIDEO_TOL = 1e-5
SHAPE = dict(height=32, width=48, num_frames=5, num_inference_steps=STEPS)
# Text + glyph tokens (tiny tokenizer) of prompt / negative prompt: GLYPH 27 + 14 / 16 + 0, OTHER 34 + 26 / 22 + 0
# (the same buckets: 64 + 64 / 64 + 0), LONG 97 + 14 / 16 + 0 (its prompt's text in the 128 bucket).
GLYPH = dict(prompt='a sign that says "open"', negative_prompt="blurry", seed=1, guidance_scale=5.0)
OTHER = dict(prompt='a sign that says "closed for today"', negative_prompt="blurry, dark", seed=3, guidance_scale=4.0)
LONG = dict(prompt='a red fox jumps over the lazy dog by a sign that says "open" ' * 2, negative_prompt="blurry",
            seed=4, guidance_scale=5.0)
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


def _requests(engine, *fields):
    return [build_request(engine.instance.card, **SHAPE, **f) for f in fields]


def _counts(plan) -> list[tuple[int, int]]:
    """(text, glyph) valid rows of the plan's prompt and negative prompt: the tensor counts of padded ones."""
    rows = (plan.inputs["prompt"].rows[0], plan.inputs["negative"].rows[0])
    return [tuple(r.valid.tolist()) if r.valid is not None else (r.text.shape[0], r.glyph.shape[0]) for r in rows]


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "bucket-padded"])
def test_a_step_runs_no_op_a_cuda_graph_cannot_hold(plain, graphs):
    engine = graphed_generator(plain, RecordingCapturer()).engine if graphs else plain.engine
    with first_plans(engine, _requests(engine, GLYPH, PLAIN)) as plans:
        lengths = {plan.inputs["prompt"].rows[0].text.shape[0] for plan in plans}
        assert len(lengths) == (1 if graphs else 2) and all(plan.inputs["negative"] is not None for plan in plans)
        for plan in plans:
            ops = _ops(lambda: plan.call(**plan.inputs))
            assert not ops & UNCAPTURABLE, sorted(ops & UNCAPTURABLE)
        # Rows of other lengths (eager) or glyph buckets (padded), padded and masked without a device read: the
        # stacked step (runtime.batching stacks its inputs, per-request scales included, before the call a graph
        # would hold).
        log, call = OpLog(), plans[0].call

        def logged(**inputs):
            with log:
                return call(**inputs)

        with torch.inference_mode():
            run_batched([dataclasses.replace(plan, call=logged) for plan in plans])
    assert any("scaled_dot_product" in op for op in log.ops)
    assert not log.ops & UNCAPTURABLE, sorted(log.ops & UNCAPTURABLE)


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "bucket-padded"])
def test_an_image_to_video_meanflow_step_runs_no_op_a_cuda_graph_cannot_hold(tmp_path, graphs):
    write_i2v_pipeline(tmp_path, "p2")
    engine = VideoGenerator.from_pretrained(tmp_path, device="cpu")
    engine = graphed_generator(engine, RecordingCapturer()).engine if graphs else engine.engine
    request = build_request(engine.instance.card, image=[make_image(50, 30, 1)], num_frames=5,
                            num_inference_steps=STEPS, **GLYPH)
    with first_plans(engine, [request]) as (plan,):
        assert plan.inputs["network"].timestep_r is not None and plan.inputs["network"].inputs.image is not None
        assert (plan.inputs["prompt"].rows[0].valid is not None) == graphs
        ops = _ops(lambda: plan.call(**plan.inputs))
    assert not ops & UNCAPTURABLE, sorted(ops & UNCAPTURABLE)


def test_graphed_prompts_are_padded_to_their_buckets_and_eager_ones_are_not(plain):
    graphed = graphed_generator(plain, RecordingCapturer())
    for fields in (GLYPH, OTHER, LONG):
        with first_plans(plain.engine, _requests(plain.engine, fields)) as (eager,), \
                first_plans(graphed.engine, _requests(graphed.engine, fields)) as (padded,):
            real = _counts(eager)
            assert all(r.valid is None for r in (*eager.inputs["prompt"].rows, *eager.inputs["negative"].rows))
            assert _counts(padded) == real
            for row, (text, glyph) in zip((padded.inputs["prompt"].rows[0], padded.inputs["negative"].rows[0]), real):
                assert row.text.shape[0] == bucket_length(text) and row.text.shape[0] % PROMPT_BUCKET == 0
                assert row.glyph.shape[0] == (bucket_length(glyph) if glyph else 0)  # no glyph text: no glyph rows
                assert not row.text[text:].any() and not row.glyph[glyph:].any()  # zero padding


def test_prompts_of_one_bucket_share_a_graph_and_match_eager(plain):
    """GLYPH captures; OTHER (other prompt, negative and glyph lengths, the same buckets) replays its graph; LONG's
    prompt is in the next text bucket: it captures anew. Each decoded float32 video within VIDEO_TOL of eager."""
    capturer = RecordingCapturer()
    graphed = graphed_generator(plain, capturer)
    with first_plans(plain.engine, _requests(plain.engine, GLYPH, OTHER, LONG)) as plans:
        glyph, other, long = (_counts(p) for p in plans)
    assert glyph != other and glyph[0][0] != long[0][0]
    assert [[bucket_length(n) for n in pair if n] for pair in glyph] == \
        [[bucket_length(n) for n in pair if n] for pair in other]
    assert bucket_length(long[0][0]) > bucket_length(glyph[0][0])
    for fields, (captures, replays) in zip((GLYPH, OTHER, LONG), [(1, STEPS), (1, 2 * STEPS), (2, 3 * STEPS)]):
        request = _requests(plain.engine, fields)[0]
        want, got = plain.engine.run(request)["video"], graphed.engine.run(request)["video"]
        assert got.shape == want.shape and np.abs(got - want).max() <= VIDEO_TOL, fields["prompt"]
        assert graphed.engine.graph_stats == {"captures": captures, "replays": replays, "fallbacks": 0}
        assert capturer.calls == captures


def test_the_estimate_counts_the_condition_rows_at_their_buckets(plain):
    graphed = graphed_generator(plain, RecordingCapturer())
    request = resolve_request(_requests(plain.engine, GLYPH)[0], plain.card)
    eager, padded = footprint(plain.engine.instance, request), footprint(graphed.engine.instance, request)
    assert padded.denoise > eager.denoise  # MAX_PROMPT_TOKENS (1000) padded to 1024 rows through every block
    assert (padded.decode, padded.persistent) == (eager.decode, eager.persistent)
