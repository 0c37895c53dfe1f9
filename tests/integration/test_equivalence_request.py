"""Equivalence rule, request side: every GenerationRequest field set to the same value through
`vidloom generate`, the Python API and the HTTP server (official openai client where it has the
field, a JSON extension otherwise) gives the same resolved request and the same frames.

The parameter list is GenerationRequest's own fields: a new field with no row in PATHS fails here
until it has a way in from every entry point (or a stated reason why not).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.helpers.three_paths import CliServer, Outcome, assert_same_outcome, request_forms, run_api, run_cli
from vidloom.core.deploy import DeployConfig
from vidloom import registry
from vidloom.core.request import GenerationRequest

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # openai marks the Sora API deprecated


@dataclass(frozen=True)
class FieldPaths:
    """One request field set to `value` on each path."""

    value: Any
    cli: tuple[str, ...]  # `vidloom generate` arguments
    api: dict[str, Any]  # VideoGenerator.generate keyword arguments
    openai: dict[str, Any]  # official client parameters (videos.create)
    extension: dict[str, Any]  # extra JSON fields (our documented extensions)


@dataclass(frozen=True)
class Exempt:
    reason: str


def _ext(name: str, value: Any, cli: tuple[str, ...]) -> FieldPaths:
    """A field the official client lacks: a JSON extension of the same name on the server."""
    return FieldPaths(value, cli, {name: value}, {}, {name: value})


# Base request (every path sets it explicitly): demo model, 2 steps, 48x32, 5 frames. A deployed
# step cache at threshold 0 (computes every step) lets step_cache_threshold be overridden per request.
BASE, BASE_CLI, BASE_OPENAI, BASE_EXT = request_forms("a red fox jumps over a frozen river", seed=7)
DEPLOY_FLAGS = ["--step-cache", "teacache", "--step-cache-threshold", "0"]
DEPLOY = DeployConfig(step_cache="teacache", step_cache_threshold=0.0)

PATHS: dict[str, FieldPaths | Exempt] = {
    "prompt": FieldPaths("two dogs play in a green park", ("--prompt", "two dogs play in a green park"),
                         {"prompt": "two dogs play in a green park"}, {"prompt": "two dogs play in a green park"}, {}),
    "task": Exempt("every entry point here is text-to-video; the image route picks t2i/t2v from the card"),
    "negative_prompt": _ext("negative_prompt", "blurry, low quality", ("--negative-prompt", "blurry, low quality")),
    "height": FieldPaths(48, ("--height", "48"), {"height": 48}, {"size": "48x48"}, {}),
    "width": FieldPaths(64, ("--width", "64"), {"width": 64}, {"size": "64x32"}, {}),
    "num_frames": _ext("num_frames", 9, ("--frames", "9")),
    "fps": _ext("fps", 12, ("--fps", "12")),
    "num_inference_steps": _ext("num_inference_steps", 3, ("--steps", "3")),
    "guidance_scale": _ext("guidance_scale", 2.5, ("--guidance", "2.5")),
    "flow_shift": _ext("flow_shift", 7.0, ("--shift", "7")),
    "sampler": _ext("sampler", "euler", ("--sampler", "euler")),
    "seed": _ext("seed", 11, ("--seed", "11")),
    # The CLI runs one request per process, so its deployment threshold is the request's.
    "step_cache_threshold": _ext("step_cache_threshold", 1e6, ("--step-cache-threshold", "1e6")),
    "request_id": Exempt("generated per request by each entry point (the server's are job ids)"),
    # Media inputs need an I2V / V2V / two-expert checkpoint and arrive over HTTP as multipart uploads the
    # official client's videos.create cannot send with extensions; each path has its own tests
    # (test_wan_i2v_generation, test_wan_v2v_generation, test_server_videos uploads, test_cli).
    "image": Exempt("needs an image-to-video card and a multipart upload (see the comment above)"),
    "last_image": Exempt("needs a first-last-frame card and a multipart upload"),
    "video": Exempt("needs a multipart upload over HTTP"),
    "strength": Exempt("only with video (video-to-video)"),
    "guidance_scale_2": Exempt("needs a two-expert (Wan2.2 A14B) card"),
    # A finished causal (AnyFlow-FAR) video: the Python API takes its output, the server its video id; the CLI
    # runs one request per process, so it has no finished video to extend (test_far_sessions.py, both paths).
    "extend_from": Exempt("needs a causal card and a finished video of it (see the comment above)"),
    "reason": Exempt("needs a unified (Cosmos3) card: the three paths are compared in test_equivalence_cosmos3.py"),
    "loras": Exempt("needs adapters loaded on the model; HTTP vs the Python API is compared in test_lora_server.py, "
                    "the CLI's --lora in test_lora_api.py, the Python API vs diffusers in test_lora_generation.py"),
    "sound": Exempt("needs a Cosmos3 card with an audio tokenizer: the three paths are compared in test_equivalence_cosmos3.py"),
    "action": Exempt("needs a Cosmos3 card with an action pathway: HTTP vs the Python API in test_server_actions.py, "
                     "the CLI vs the Python API in test_cli_actions.py"),
    # Camera-controlled world models (SANA-WM) need their card and a multipart first frame: the Python API is
    # compared with diffusers in test_sana_wm_generation.py, the CLI with the server in test_sana_wm_cli_server.py.
    "camera": Exempt("needs a SANA-WM card and a first frame (see the comment above)"),
    "c2w": Exempt("needs a SANA-WM card and a first frame (see the comment above)"),
    "intrinsics": Exempt("needs a SANA-WM card and a first frame (see the comment above)"),
    # Audio-only cards (Stable Audio): HTTP vs the Python API in test_server_audio.py, the CLI in
    # test_stable_audio_api.py (the same waveform on each path).
    "seconds": Exempt("needs an audio-only (Stable Audio) card (see the comment above)"),
    "seconds_start": Exempt("needs an audio-only (Stable Audio) card (see the comment above)"),
    "init_audio": Exempt("needs an audio-only card and a multipart audio upload (see the comment above)"),
    "amplify_first_chunk": Exempt("needs a Helios-Distilled card: the three paths are compared in "
                                  "test_helios_distilled_requests.py"),
    "options": Exempt("each option of the families' blocks has its own row here"),
}


def _fields_and_options() -> list[str]:
    options = [name for block, _ in registry.option_blocks().values() for name in block.names]
    return [f.name for f in dataclasses.fields(GenerationRequest)] + options


def test_every_request_field_has_a_row():
    fields = _fields_and_options()
    missing = [name for name in fields if name not in PATHS]
    assert not missing, f"GenerationRequest fields or options with no CLI/API/server path in this table: {missing}"
    assert set(PATHS) <= set(fields), f"rows for fields that no longer exist: {set(PATHS) - set(fields)}"


@pytest.fixture(scope="module")
def served(demo_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CliServer]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VIDLOOM_CACHE", str(demo_cache))
        running = CliServer(DEPLOY_FLAGS, tmp_path_factory.mktemp("equivalence-serve"))
        assert running.url is not None, f"vidloom serve exited with {running.code}"
        yield running
        running.stop()


def _effective(outcome: Outcome, name: str) -> Any:
    meta = outcome.output.metadata
    return meta["step_cache"]["threshold"] if name == "step_cache_threshold" else meta[name]


@pytest.mark.parametrize("name", _fields_and_options())
def test_field_reaches_the_engine_the_same_way_from_every_entry_point(
    name: str, served: CliServer, demo_cache: Path, tmp_path: Path, capsys, monkeypatch
):
    row = PATHS.get(name)
    assert row is not None, f"{name}: no row in PATHS (see test_every_request_field_has_a_row)"
    if isinstance(row, Exempt):
        pytest.skip(row.reason)
    monkeypatch.setenv("VIDLOOM_CACHE", str(demo_cache))
    cli_argv = [*BASE_CLI, *DEPLOY_FLAGS, *row.cli]
    cli = run_cli(cli_argv, tmp_path / "cli.mp4", capsys)
    api = run_api(demo_cache, DEPLOY, **{**BASE, **row.api})
    http = served.run({**BASE_OPENAI, **row.openai}, {**BASE_EXT, **row.extension})

    for outcome in (cli, api, http):
        assert _effective(outcome, name) == row.value, f"{name} did not reach the engine"
    # The CLI sets step_cache_threshold through its deployment (one request per process).
    assert_same_outcome(api, cli, f"{name}: CLI vs Python API", same_deploy=name != "step_cache_threshold")
    assert_same_outcome(api, http, f"{name}: HTTP vs Python API")
    # The job's stored parameters are the resolved request the engine ran.
    stored = {k: v for k, v in http.parameters.items() if k in api.comparable()}
    assert stored == {k: api.comparable()[k] for k in stored} and len(stored) >= 12
