"""Every invalid parallel plan is refused before any worker process starts, naming what to change."""

from __future__ import annotations

import multiprocessing
import time

import pytest
import torch

from tests.helpers.wan_checkpoints import TINY_B, write_tiny_wan
from vidloom.cli import build_parser, main
from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import DeployError, InvalidRequest
from vidloom.core.parallel import ParallelPlan, SequenceGeometry, TokenLayout
from vidloom.core.request import GenerationRequest
from vidloom.cli.deploy_args import deploy_config
from vidloom.generator import VideoGenerator
from vidloom.families.wan.demo import demo_card
from vidloom.runtime.parallel.engine import ParallelEngine, PoolInstance
from vidloom.runtime.parallel.plan import check_model, check_request, check_step_cache, check_warmup, sp_attention

# Wan2.1 geometry with 4 heads: 8x spatial / 4x temporal VAE, 1x2x2 patches.
GRID4 = SequenceGeometry(num_heads=4, patch_size=(1, 2, 2), vae_spatial=8, vae_temporal=4)
WAN4 = TokenLayout(num_heads=4, streams=("video",), grid=GRID4)


@pytest.mark.parametrize("kwargs, match", [
    (dict(sp=0), r"parallel.sp \(--sp\) must be an integer >= 1, got 0"),
    (dict(sp=1.5), r"parallel.sp"),
    (dict(cfg=5), r"parallel.cfg must be 1 to 4"),
    (dict(cfg=0), r"parallel.cfg must be 1 to 4"),
])
def test_plan_degrees(kwargs, match):
    with pytest.raises(DeployError, match=match):
        ParallelPlan(**kwargs)


@pytest.mark.parametrize("kwargs, match", [
    (dict(devices=2), r"devices \(--devices\) is 2 but the parallel plan sp=1 x cfg=1 needs sp x cfg = 1"),
    (dict(devices=4, parallel=ParallelPlan(sp=2)), r"is 4 but the parallel plan sp=2 x cfg=1 needs sp x cfg = 2"),
    (dict(devices=0), r"devices \(--devices\) must be an integer >= 1"),
    (dict(devices=2, parallel=ParallelPlan(cfg=2), cfg_mode="batched"), r"cfg_mode='batched' and CFG-parallel"),
])
def test_deploy_config_checks_the_plan_against_devices_and_options(kwargs, match):
    with pytest.raises(DeployError, match=match):
        DeployConfig(**kwargs)


def test_step_caches_run_with_sp_over_an_even_layout_and_with_cfg_parallel_alone():
    for plan, layout in ((ParallelPlan(sp=2), WAN4), (ParallelPlan(cfg=2), JOINT), (ParallelPlan(sp=1), JOINT)):
        check_step_cache(DeployConfig(devices=plan.world_size, parallel=plan, step_cache="fbcache"), layout)
    padded = DeployConfig(devices=2, parallel=ParallelPlan(sp=2), step_cache="fbcache")
    with pytest.raises(DeployError, match="padded to split, and the pad rows would enter the cache's change measure"):
        check_step_cache(padded, JOINT)


def test_an_sp_that_does_not_divide_the_heads_runs_as_ring_attention():
    for sp in (3, 4):
        check_model(ParallelPlan(sp=sp), WAN4)
    assert sp_attention(ParallelPlan(sp=4), WAN4) == "ulysses"
    assert sp_attention(ParallelPlan(sp=3), WAN4) == "ring"


def test_token_count_must_split_without_padding():
    plan = ParallelPlan(sp=2)
    ok = GenerationRequest(prompt="x", height=32, width=48, num_frames=5, guidance_scale=5.0)
    assert GRID4.patch_grid(32, 48, 5) == (2, 2, 3)
    check_request(plan, WAN4, ok)
    odd_frames = GenerationRequest(prompt="x", height=48, width=48, num_frames=9, guidance_scale=5.0)  # 3x3x3
    with pytest.raises(InvalidRequest, match=r"num_frames: .*3x3x3 patch grid = 27 video tokens.*does not pad") as err:
        check_request(plan, WAN4, odd_frames)
    assert err.value.field == "num_frames"
    image = GenerationRequest(prompt="x", height=48, width=48, num_frames=1, guidance_scale=5.0)  # 1x3x3
    with pytest.raises(InvalidRequest, match="height/16") as err:
        check_request(plan, WAN4, image)
    assert err.value.field == "height"


def test_cfg_parallel_needs_guidance():
    request = GenerationRequest(prompt="x", height=32, width=48, num_frames=5, guidance_scale=1.0)
    with pytest.raises(InvalidRequest, match=r"guidance_scale: 1.0 turns classifier-free guidance off.*--cfg-parallel"):
        check_request(ParallelPlan(cfg=2), WAN4, request)


JOINT = TokenLayout(num_heads=4, streams=("text", "image"), split="pad",
                    cfg_needs=("guidance_scale", "negative_prompt"))


def test_a_padded_layout_runs_any_size_and_its_cfg_needs_are_checked_at_submit():
    odd = dict(prompt="x", height=48, width=48, num_frames=1, guidance_scale=4.0)
    check_request(ParallelPlan(sp=2), JOINT, GenerationRequest(**odd))  # 3x3 tokens and any text: padded
    check_request(ParallelPlan(cfg=2), JOINT, GenerationRequest(**odd, negative_prompt="blurry"))
    with pytest.raises(InvalidRequest, match="non-empty negative prompt.*--cfg-parallel") as err:
        check_request(ParallelPlan(cfg=2), JOINT, GenerationRequest(**odd))
    assert err.value.field == "negative_prompt"
    check_warmup(DeployConfig(devices=2, parallel=ParallelPlan(sp=2), warmup_shapes=((48, 48, 1),)), JOINT)


def test_a_layout_without_classic_cfg_refuses_cfg_parallel_with_its_reason():
    distilled = TokenLayout(num_heads=4, streams=("text", "image"), split="pad", cfg_parallel="no CFG to split")
    check_model(ParallelPlan(sp=2), distilled)
    with pytest.raises(DeployError, match="--cfg-parallel: no CFG to split"):
        check_model(ParallelPlan(cfg=2), distilled)


# SANA-WM's layout: bands of patch rows of every frame (32x spatial / 8x temporal VAE, 1x1x1 patches, 2 heads).
ROWS = TokenLayout(num_heads=2, streams=("video",), split="rows",
                   grid=SequenceGeometry(num_heads=2, patch_size=(1, 1, 1), vae_spatial=32, vae_temporal=8))


def test_a_rows_layout_needs_rows_and_heads_that_split():
    plan = ParallelPlan(sp=2)
    check_request(plan, ROWS, GenerationRequest(prompt="x", height=64, width=96, num_frames=17, guidance_scale=5.0))
    # 3 x 3 x 3 = 27 tokens would be refused by an even layout for num_frames; here only the rows matter.
    odd_rows = GenerationRequest(prompt="x", height=96, width=64, num_frames=17, guidance_scale=5.0)
    with pytest.raises(InvalidRequest, match=r"96x64 is 3 patch rows per frame.*height/32.*multiple of 2") as err:
        check_request(plan, ROWS, odd_rows)
    assert err.value.field == "height"
    check_step_cache(DeployConfig(devices=2, parallel=plan, step_cache="fbcache"), ROWS)  # no pad rows to measure
    check_model(ParallelPlan(sp=2), ROWS)
    with pytest.raises(DeployError, match=r"--sp 4: .*linear attention over its 2 heads.*must divide 2"):
        check_model(ParallelPlan(sp=4), ROWS)


def test_warmup_shapes_follow_the_request_rules():
    deploy = DeployConfig(devices=2, parallel=ParallelPlan(sp=2), warmup_shapes=((48, 48, 9),))
    with pytest.raises(DeployError, match="warmup_shapes entry 48x48x9"):
        check_warmup(deploy, WAN4)


def test_requests_are_checked_at_submit_without_contacting_workers():
    class NoWorkers:
        epoch, broken = 1, False

        def call(self, command):
            raise AssertionError("a worker was contacted")

    deploy = DeployConfig(devices=2, parallel=ParallelPlan(sp=2))
    engine = ParallelEngine(NoWorkers(), PoolInstance(demo_card(), deploy, torch.device("cpu"), "unused"), WAN4)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest, match="num_frames"):
        engine.submit(GenerationRequest(prompt="x", height=48, width=48, num_frames=9))
    with pytest.raises(InvalidRequest, match="step_cache_threshold"):
        engine.submit(GenerationRequest(prompt="x", height=32, width=48, num_frames=5, step_cache_threshold=0.1))
    # Adapters the ranks do not hold are named at submit, as one device names them.
    with pytest.raises(InvalidRequest, match="no LoRA adapter 'ink' is loaded") as err:
        engine.submit(GenerationRequest(prompt="x", height=32, width=48, num_frames=5, loras=(("ink", 1.0),)))
    assert err.value.field == "loras[0].name"
    run = engine.submit(GenerationRequest(prompt="x", height=32, width=48, num_frames=5))
    assert run.request.seed is not None and not run.done  # resolved here, so every rank gets the same seed


@pytest.fixture(scope="module")
def tiny_b(tmp_path_factory):
    return write_tiny_wan(tmp_path_factory.mktemp("tiny-b"), TINY_B)  # 3 attention heads


def test_from_pretrained_refuses_before_any_process_starts(tiny_b):
    before = set(multiprocessing.active_children())
    started = time.perf_counter()
    with pytest.raises(DeployError, match=r"devices \(--devices\) is 3"):
        VideoGenerator.from_pretrained(tiny_b, device="cpu", devices=3, parallel=ParallelPlan(cfg=2))
    # without CUDA the device check (placement.resolve_device) refuses first; with CUDA, the plan's
    with pytest.raises(DeployError, match="pass device='cuda'|sees no CUDA device"):
        VideoGenerator.from_pretrained(tiny_b, device="cuda:1", parallel=ParallelPlan(cfg=2))
    assert set(multiprocessing.active_children()) <= before
    assert time.perf_counter() - started < 5  # config files only: no weights, no workers


def test_cli_flags_build_the_plan_and_bad_ones_fail_with_exit_2(tiny_b, capsys):
    before = set(multiprocessing.active_children())
    parser = build_parser()
    args = parser.parse_args(["generate", "--prompt", "x", "--sp", "2", "--cfg-parallel"])
    deploy = deploy_config(args)
    assert deploy.parallel == ParallelPlan(sp=2, cfg=2) and deploy.devices == 4
    assert deploy_config(parser.parse_args(["serve", "--sp", "2"]), launched_world=2).devices == 2
    assert main(["generate", "--prompt", "x", "--model", str(tiny_b), "--devices", "2", "--sp", "3"]) == 2
    assert "is 2 but the parallel plan sp=3 x cfg=1" in capsys.readouterr().err
    assert set(multiprocessing.active_children()) <= before


def test_a_cfg_degree_above_two_spreads_guidance_passes_only_where_a_step_has_that_many():
    with pytest.raises(DeployError, match="parallel.cfg must be 1 to 4"):
        ParallelPlan(cfg=5)
    with pytest.raises(DeployError, match="at most 2 guidance passes.*--cfg-parallel 2 or less"):
        check_model(ParallelPlan(cfg=3), WAN4)  # classic CFG: two branches
    check_model(ParallelPlan(cfg=4), TokenLayout(num_heads=4, streams=("video", "audio"), split="pad", cfg_passes=4))
    parser = build_parser()
    assert deploy_config(parser.parse_args(["generate", "--prompt", "x", "--cfg-parallel"])).parallel.cfg == 2
    plan = deploy_config(parser.parse_args(["generate", "--prompt", "x", "--cfg-parallel", "3"])).parallel
    assert plan.cfg == 3 and plan.world_size == 3
    assert deploy_config(parser.parse_args(["generate", "--prompt", "x"])).parallel.cfg == 1
