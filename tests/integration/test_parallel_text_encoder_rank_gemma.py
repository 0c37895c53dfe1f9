"""--text-encoder-rank for the Gemma-encoded families on real pools (gloo, CPU, float32): LTX-2 and SANA-WM.

Each case starts two pools of two ranks on a tiny checkpoint, replicated then with the encoders on rank 1, so rank 0
(which answers the parent) receives: the outputs are bitwise the replicated pool's, and rank 0 holds exactly the
encoders' bytes less.
- LTX-2 (sp=2): Gemma 3 lives on rank 1 alone; the text connectors stay on both ranks (a LoRA target). An adapter
  on the transformer and the connectors is loaded on both pools and a request runs with it and without it: the
  owner encodes under the request's connector adapter, as every rank of the replicated pool does. Video and audio.
- SANA-WM (--two-stage, cfg=2): stage 1's Gemma-2 and the refiner's Gemma-3 with its connectors, two prompt nodes,
  both on rank 1; a repeated prompt hits the owner's prompt cache.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.helpers.lora_files import LoRASpec, write_ltx2_lora_with_connectors
from tests.helpers.sana_wm_checkpoints import SANA_WM_A, write_tiny_refiner, write_tiny_sana_wm
from tests.helpers.wan_i2v_checkpoints import make_image
from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import DeployError
from vidloom.core.parallel import ParallelPlan
from vidloom.generator import VideoGenerator, build_request
from vidloom.runtime.parallel.shard_weights import held_weight_bytes
from vidloom.runtime.parallel.worker import PoolOptions

OPTIONS = PoolOptions(collective_timeout_s=120, check_lockstep=True)
LTX2_REQUEST = dict(prompt="a robot dancing", negative_prompt="blurry", height=64, width=64, num_frames=9, fps=25,
                    num_inference_steps=2, guidance_scale=3.0, seed=2)
# The connectors' input projection and their blocks' linears; a transformer adapter beside them (one file, as
# LTX2LoraLoaderMixin writes it).
CONNECTORS_SPEC = LoRASpec(rank=4, alpha=6, seed=13, std=0.6,
                           targets=r".*(text_proj_in|to_q|to_k|to_v|to_out\.0|ff\.net\.0\.proj|ff\.net\.2)")
TRANSFORMER_SPEC = LoRASpec(rank=2, alpha=2, targets=("to_q", "to_v"), seed=11)
# 64x96, 17 frames: 3 latent frames, 2 patch rows a frame (one per sp rank); the refiner refines them whole.
SANA_WM_REQUEST = dict(prompt="a quiet forest path", negative_prompt="blurry", height=64, width=96, num_frames=17,
                       camera="jw-16", image=make_image(70, 40, 1), intrinsics=[50.0, 52.0, 35.0, 20.0],
                       num_inference_steps=2, guidance_scale=3.0)
SANA_WM_DEPLOY = dict(two_stage=True, prompt_cache_size=4)


@pytest.fixture(scope="module")
def ltx2_lora(ltx2_dir, tmp_path_factory) -> Path:
    return write_ltx2_lora_with_connectors(ltx2_dir, TRANSFORMER_SPEC, CONNECTORS_SPEC,
                                           tmp_path_factory.mktemp("ltx2-lora"))


@pytest.fixture(scope="module")
def sana_wm(tmp_path_factory) -> Path:
    folder = write_tiny_sana_wm(tmp_path_factory.mktemp("sana-wm"), SANA_WM_A)
    write_tiny_refiner(folder, SANA_WM_A)
    return folder


def _pool(folder: Path, plan: ParallelPlan, requests: list[dict[str, Any]], lora: Path | None = None,
          **deploy: Any) -> tuple[list[dict[str, Any]], list[int]]:
    """Every request's result on a pool of `plan`, and the weight bytes each rank holds."""
    with VideoGenerator.from_pretrained(folder, device="cpu", pool_options=OPTIONS,
                                        deploy=DeployConfig(devices=plan.world_size, parallel=plan, **deploy)) as gen:
        if lora is not None:
            gen.load_lora("both", lora)
        results = []
        for fields in requests:
            fields = dict(fields)
            results.append(gen.engine.run(build_request(gen.card, fields.pop("prompt"), **fields)))
        held = gen.engine.weight_bytes()
        assert not gen.engine.broken
    return results, held


def _assert_equal(placed: list[dict[str, Any]], replicated: list[dict[str, Any]], keys: tuple[str, ...]) -> None:
    for got, want in zip(placed, replicated, strict=True):
        for key in keys:
            a, b = np.asarray(got[key]), np.asarray(want[key])
            assert a.dtype == b.dtype and np.array_equal(a, b), key  # the broadcast copies the prompt's bits


def test_ltx2_gemma_on_one_rank_connectors_and_their_lora_on_every_rank(ltx2_dir, ltx2_lora):
    requests = [LTX2_REQUEST, dict(LTX2_REQUEST, loras={"both": 0.8})]
    replicated, held_everywhere = _pool(ltx2_dir, ParallelPlan(sp=2), requests, ltx2_lora)
    placed, held_placed = _pool(ltx2_dir, ParallelPlan(sp=2, text_encoder_rank=1), requests, ltx2_lora)
    assert np.abs(replicated[1]["video"] - replicated[0]["video"]).max() > 1e-3  # the adapter acts
    _assert_equal(placed, replicated, ("video", "audio"))
    instance = VideoGenerator.from_pretrained(ltx2_dir, device="cpu").engine.instance
    connectors = held_weight_bytes({"connectors": instance["connectors"]})
    gemma = held_weight_bytes({"text_encoder": instance["text_encoder"]}) - connectors  # the encoder holds both
    assert gemma > 0 and connectors > 0
    assert held_placed[1] == held_everywhere[1] == held_everywhere[0]
    assert held_placed[0] == held_everywhere[0] - gemma  # the connectors stay; no byte of Gemma
    print(f"ltx2: weight bytes per rank replicated {held_everywhere}, Gemma on rank 1 {held_placed}; Gemma {gemma}, "
          f"connectors {connectors}")


def test_sana_wm_both_encoders_on_one_rank(sana_wm):
    requests = [dict(SANA_WM_REQUEST, seed=seed) for seed in (7, 8)]  # the second prompt hits the owner's cache
    plan = ParallelPlan(cfg=2)
    replicated, held_everywhere = _pool(sana_wm, plan, requests, **SANA_WM_DEPLOY)
    placed, held_placed = _pool(sana_wm, ParallelPlan(cfg=2, text_encoder_rank=1), requests, **SANA_WM_DEPLOY)
    _assert_equal(placed, replicated, ("video",))
    one = VideoGenerator.from_pretrained(sana_wm, device="cpu", deploy=DeployConfig(two_stage=True))
    instance = one.engine.instance
    encoders = held_weight_bytes({name: instance[name] for name in ("text_encoder", "refiner_text")})
    stage1 = held_weight_bytes({"text_encoder": instance["text_encoder"]})
    assert 0 < stage1 < encoders
    assert held_placed[1] == held_everywhere[1] == held_everywhere[0]
    assert held_placed[0] == held_everywhere[0] - encoders  # neither Gemma, nor the refiner's connectors
    print(f"sana-wm: weight bytes per rank replicated {held_everywhere}, encoders on rank 1 {held_placed}; "
          f"Gemma-2 {stage1}, refiner Gemma-3 + connectors {encoders - stage1}")


@pytest.mark.parametrize("rank", [2, -1])
@pytest.mark.parametrize("family", ["ltx2", "sana-wm"])
def test_a_rank_outside_the_plan_is_refused_naming_the_field(family, rank, request):
    folder = request.getfixturevalue("ltx2_dir" if family == "ltx2" else "sana_wm")
    with pytest.raises(DeployError, match=r"parallel\.text_encoder_rank \(--text-encoder-rank\)"):
        VideoGenerator.from_pretrained(folder, device="cpu", parallel=ParallelPlan(sp=2, text_encoder_rank=rank))
