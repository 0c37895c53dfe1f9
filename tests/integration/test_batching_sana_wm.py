"""Cross-request batching of SANA-WM stage-1 steps: requests of one shape share a forward whatever their first
images, cameras, prompts, seeds, step counts and guidance scales; each CFG pair stays together (SanaWMText.stack).

Batched and single forwards differ only by matmul blocking over the batch (float32 tiny checkpoint): 1e-5 of the
magnitude on a step's output, as for the other families (test_batching.py); the decoded frames within one uint8 level.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.batched_runs import assert_batched_equals_single, first_plans, serve_batched
from tests.helpers.lora_files import LoRASpec, write_peft_lora
from tests.helpers.sana_wm_checkpoints import SANA_WM_A, build_transformer, write_tiny_sana_wm
from tests.helpers.wan_i2v_checkpoints import make_image
from vidloom.generator import VideoGenerator, build_request
from vidloom.lora.registry import attach_registry
from vidloom.runtime.batching import batch_key
from vidloom.runtime.results import video_output

RTOL = 1e-5
UINT8_TOLERANCE = 1
SHAPE = dict(height=64, width=96, num_frames=17, camera="jw-16", negative_prompt="blurry")


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    folder = write_tiny_sana_wm(tmp_path_factory.mktemp("sana-wm-batch") / "sana", SANA_WM_A)
    return VideoGenerator.from_pretrained(folder, device="cpu").engine


def _requests(engine, **override):
    kinds = [dict(prompt="a red fox jumps", image=make_image(70, 40, 1), intrinsics=[50.0, 52.0, 35.0, 20.0], seed=1,
                  guidance_scale=3.0, num_inference_steps=2),
             dict(prompt="a blue cat naps", image=make_image(70, 40, 2), intrinsics=[44.0, 47.0, 30.0, 22.0], seed=2,
                  guidance_scale=4.5, num_inference_steps=3)]
    return [build_request(engine.instance.card, **{**SHAPE, **k, **override}) for k in kinds]


@pytest.mark.parametrize("guidance", [None, 1.0], ids=["cfg", "no-cfg"])
def test_a_batched_step_equals_the_single_steps(engine, guidance):
    override = {} if guidance is None else {"guidance_scale": guidance}
    with first_plans(engine, _requests(engine, **override)) as plans:
        assert batch_key(plans[0]) is not None and batch_key(plans[0]) == batch_key(plans[1])
        assert_batched_equals_single(plans, RTOL)


def test_guided_and_unguided_requests_do_not_share_a_forward(engine):
    with first_plans(engine, [_requests(engine)[0], _requests(engine, guidance_scale=1.0)[1]]) as plans:
        assert batch_key(plans[0]) != batch_key(plans[1])  # one text row against a CFG pair


def test_concurrent_requests_equal_their_single_runs(engine):
    requests = _requests(engine)
    expected = [video_output(engine.instance.card, engine.run(r)).frames for r in requests]
    got, stats = serve_batched(engine, requests)
    assert stats["largest_batch"] == 2  # stage-1 steps really were shared
    for out, alone in zip(got, expected):
        assert np.abs(out.frames.astype(int) - alone.astype(int)).max() <= UINT8_TOLERANCE
        assert "disabled" not in out.metadata


def test_a_request_with_an_adapter_batches_with_one_without(engine, tmp_path):
    """Each run's adapters reach only its own rows (lora_rows_scope) in SANA-WM's [runs; runs] CFG layout."""
    spec = LoRASpec(rank=4, alpha=8, targets=r".*(attn\.qkv|cross_attn\.q_linear|out_proj_cam)", seed=5, std=0.1)
    registry = attach_registry(engine.instance)
    registry.load("a", write_peft_lora(build_transformer(SANA_WM_A), spec, tmp_path, "sana-wm-lora"))
    try:
        plain, adapted = _requests(engine)[0], _requests(engine, loras={"a": 1.0})[1]
        expected = [video_output(engine.instance.card, engine.run(r)).frames for r in (plain, adapted)]
        got, stats = serve_batched(engine, [plain, adapted])
    finally:
        registry.unload("a")
    assert stats["largest_batch"] == 2
    for out, alone in zip(got, expected):
        assert np.abs(out.frames.astype(int) - alone.astype(int)).max() <= UINT8_TOLERANCE
    unadapted = video_output(engine.instance.card, engine.run(_requests(engine)[1])).frames
    assert np.abs(expected[1].astype(int) - unadapted.astype(int)).max() > 10  # the adapter acted
