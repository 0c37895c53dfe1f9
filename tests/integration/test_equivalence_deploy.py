"""Equivalence rule, deployment side: every DeployConfig field set through `vidloom generate` flags,
`vidloom serve` flags and the Python API's DeployConfig reaches the engine as the same deployment
and gives the same frames (or, where the option cannot run on this machine, the same error).

The parameter list is DeployConfig's own fields: a new field with no row in FLAGS fails here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.three_paths import CliServer, Outcome, assert_same_outcome, request_forms, run_api, run_cli
from vidloom import cli
from vidloom.core.deploy import DeployConfig
from vidloom.core.parallel import ParallelPlan
from vidloom.generator import VideoGenerator

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # openai marks the Sora API deprecated

RUN = "run"  # runs on the demo model on CPU: same deployment and frames on all three paths
REFUSED = "refused"  # refused at load on CPU: the same DeployError message on all three paths
CONFIG = "config"  # starts worker processes: the same DeployConfig reaches from_pretrained (frames: test_parallel.py)


@dataclass(frozen=True)
class FlagRow:
    flags: tuple[str, ...]
    deploy: dict[str, Any]
    kind: str = RUN


FLAGS: dict[str, FlagRow] = {
    "fp8_weights": FlagRow(("--fp8",), {"fp8_weights": True}),
    "compile": FlagRow(("--compile", "--compile-backend", "eager"), {"compile": True, "compile_backend": "eager"}),
    "compile_backend": FlagRow(("--compile", "--compile-backend", "aot_eager"),
                               {"compile": True, "compile_backend": "aot_eager"}),
    "warmup_shapes": FlagRow(("--warmup", "32x48x5"), {"warmup_shapes": ((32, 48, 5),)}),
    "offload_text_encoder": FlagRow(("--offload-text-encoder",), {"offload_text_encoder": True}),
    "prompt_cache_size": FlagRow(("--prompt-cache", "4"), {"prompt_cache_size": 4}),
    # The demo (one-expert Wan) keeps no KV and has no idle expert: its card refuses these at load.
    "kv_cache_budget_bytes": FlagRow(("--kv-cache-budget-mb", "64"), {"kv_cache_budget_bytes": 64 * 2**20}, REFUSED),
    "kv_pool_tokens": FlagRow(("--kv-pool-tokens", "4096"), {"kv_pool_tokens": 4096}, REFUSED),
    "kv_session_ttl_s": FlagRow(("--kv-session-ttl", "30"), {"kv_session_ttl_s": 30.0}, REFUSED),
    "offload_idle_expert": FlagRow(("--offload-idle-expert",), {"offload_idle_expert": True}, REFUSED),
    "vae_tile": FlagRow(("--vae-tile", "32"), {"vae_tile": 32}),
    "vae_tile_stride": FlagRow(("--vae-tile", "32", "--vae-tile-stride", "16"), {"vae_tile": 32, "vae_tile_stride": 16}),
    "attention_backend": FlagRow(("--attention-backend", "flash"), {"attention_backend": "flash"}, REFUSED),
    "cfg_mode": FlagRow(("--cfg-mode", "batched"), {"cfg_mode": "batched"}),
    "step_cache": FlagRow(("--step-cache", "fbcache"), {"step_cache": "fbcache"}),
    "step_cache_threshold": FlagRow(("--step-cache", "teacache", "--step-cache-threshold", "0.5"),
                                    {"step_cache": "teacache", "step_cache_threshold": 0.5}),
    # DBCache's flags over a policy (the demo has 2 blocks: presets shrink their Fn/Bn to F1B0).
    "step_cache_fn": FlagRow(("--step-cache", "dbcache", "--step-cache-fn", "1"),
                             {"step_cache": "dbcache", "step_cache_fn": 1}),
    "step_cache_bn": FlagRow(("--step-cache", "balanced", "--step-cache-bn", "0"),
                             {"step_cache": "balanced", "step_cache_bn": 0}),
    "step_cache_warmup": FlagRow(("--step-cache", "fast", "--step-cache-warmup", "2"),
                                 {"step_cache": "fast", "step_cache_warmup": 2}),
    "step_cache_max_cached": FlagRow(("--step-cache", "fbcache", "--step-cache-max-cached", "1"),
                                     {"step_cache": "fbcache", "step_cache_max_cached": 1}),
    "step_cache_max_continuous": FlagRow(("--step-cache", "fbcache", "--step-cache-max-continuous", "1"),
                                         {"step_cache": "fbcache", "step_cache_max_continuous": 1}),
    "step_cache_taylorseer": FlagRow(("--step-cache", "dbcache", "--step-cache-taylorseer", "2"),
                                     {"step_cache": "dbcache", "step_cache_taylorseer": 2}),
    "step_cache_mask": FlagRow(("--step-cache", "fbcache", "--step-cache-mask", "static:1010"),
                               {"step_cache": "fbcache", "step_cache_mask": "static:1010"}),
    "cuda_graphs": FlagRow(("--cuda-graphs",), {"cuda_graphs": True}, REFUSED),
    # The demo (Wan) has one stage: refused at load, naming both fields and flags.
    "two_stage": FlagRow(("--two-stage",), {"two_stage": True}, REFUSED),
    "upsampler": FlagRow(("--upsampler", "/no/such/upsampler"), {"upsampler": "/no/such/upsampler"}, REFUSED),
    "stage2_lora": FlagRow(("--two-stage", "--stage2-lora", "/no/such/stage2.safetensors"),
                           {"two_stage": True, "stage2_lora": "/no/such/stage2.safetensors"}, REFUSED),
    # A file that is not there: refused at load, naming the option, on all three paths (the demo's own transformer
    # file loading through --component and components= runs in docs/loading-checkpoints.md's examples).
    "components": FlagRow(("--component", "transformer=/no/such/transformer.safetensors"),
                          {"components": (("transformer", "/no/such/transformer.safetensors"),)}, REFUSED),
    "devices": FlagRow(("--devices", "2", "--cfg-parallel"), {"devices": 2, "parallel": ParallelPlan(cfg=2)}, CONFIG),
    "parallel": FlagRow(("--sp", "2"), {"devices": 2, "parallel": ParallelPlan(sp=2)}, CONFIG),
}

REQUEST, REQUEST_CLI, REQUEST_OPENAI, REQUEST_EXT = request_forms("a red fox jumps over a frozen river", seed=5)


def test_every_deploy_field_has_a_row():
    fields = [f.name for f in dataclasses.fields(DeployConfig)]
    missing = [name for name in fields if name not in FLAGS]
    assert not missing, f"DeployConfig fields with no flag/API row in this table: {missing}"
    for name, row in FLAGS.items():
        assert getattr(DeployConfig(**row.deploy), name) != getattr(DeployConfig(), name), f"{name}: row sets the default"


class _Stop(Exception):
    """Raised by the load spy of CONFIG rows, before any worker process starts."""


def _deploy_reaching_load(argv: list[str], monkeypatch) -> DeployConfig:
    seen: list[DeployConfig] = []

    def load(cls, *args, deploy=None, **kwargs):
        seen.append(deploy)
        raise _Stop

    monkeypatch.setattr(VideoGenerator, "from_pretrained", classmethod(load))
    with pytest.raises(_Stop):
        cli.main(argv)
    monkeypatch.undo()
    return seen[0]


@pytest.mark.parametrize("name", [f.name for f in dataclasses.fields(DeployConfig)])
def test_deploy_field_reaches_the_engine_the_same_way_from_every_entry_point(
    name: str, demo_cache: Path, tmp_path: Path, capsys, monkeypatch
):
    row = FLAGS.get(name)
    assert row is not None, f"{name}: no row in FLAGS (see test_every_deploy_field_has_a_row)"
    monkeypatch.setenv("VIDLOOM_CACHE", str(demo_cache))
    expected = DeployConfig(**row.deploy)
    if row.kind == CONFIG:
        generate = _deploy_reaching_load(["generate", "--prompt", "x", *row.flags], monkeypatch)
        monkeypatch.setenv("VIDLOOM_CACHE", str(demo_cache))
        serve = _deploy_reaching_load(["serve", "--port", "0", "--data-dir", str(tmp_path), *row.flags], monkeypatch)
        assert generate == serve == expected
        return

    cli_out = run_cli([*REQUEST_CLI, *row.flags], tmp_path / "cli.mp4", capsys)
    api = run_api(demo_cache, expected, **REQUEST)
    server = CliServer(list(row.flags), tmp_path / "serve-data")
    try:
        if row.kind == REFUSED:
            server.stop()
            http = Outcome(error=_last_error(capsys.readouterr().err))
            assert server.code == 2 and api.error is not None and name.split("_")[0] in api.error
        else:
            assert server.url is not None, f"vidloom serve {row.flags} exited with {server.code}"
            http = server.run(REQUEST_OPENAI, REQUEST_EXT)
            assert api.deploy == expected
    finally:
        server.stop()
    assert_same_outcome(api, cli_out, f"{name}: CLI vs Python API")
    assert_same_outcome(api, http, f"{name}: vidloom serve vs Python API")


def _last_error(stderr: str) -> str | None:
    lines = [line for line in stderr.splitlines() if line.startswith("error:")]
    return lines[-1] if lines else None
