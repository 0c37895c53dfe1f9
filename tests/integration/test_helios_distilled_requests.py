"""Helios-Distilled through the public API: the `distilled` block's switch reaches the loop, the card refuses
guidance, and a model without the DMD path refuses the switch by name."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.helios_checkpoints import DISTILLED_B, PYRAMID_B, write_tiny_helios_pyramid
from vidloom.core.errors import InvalidRequest
from vidloom.generator import VideoGenerator

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")
PROMPT = "a paper boat drifting down a rainy street"
SHORT = dict(num_frames=5, num_inference_steps=2, seed=3, height=32, width=64)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_tiny_helios_pyramid(tmp_path_factory.mktemp("d"), DISTILLED_B)


@pytest.fixture(scope="module")
def distilled(folder):
    return VideoGenerator.from_pretrained(folder, device="cpu")


def test_amplify_first_chunk_reaches_the_loop(distilled):
    plain = distilled.generate(PROMPT, **SHORT).frames
    amplified = distilled.generate(PROMPT, amplify_first_chunk=True, **SHORT).frames
    assert plain.shape == amplified.shape == (5, 32, 64, 3)
    assert np.abs(plain.astype(np.int16) - amplified).max() > 0  # twice the steps: another first chunk


def test_the_distilled_card_refuses_guidance(distilled):
    assert distilled.card.sampling_defaults.guidance_scale == 1.0
    with pytest.raises(InvalidRequest) as err:
        distilled.generate(PROMPT, guidance_scale=4.0, **SHORT)
    assert err.value.field == "guidance_scale"


def test_a_mid_pyramid_refuses_the_switch(tmp_path):
    mid = VideoGenerator.from_pretrained(write_tiny_helios_pyramid(tmp_path, PYRAMID_B), device="cpu")
    with pytest.raises(InvalidRequest) as err:
        mid.generate(PROMPT, amplify_first_chunk=True, **SHORT)
    assert err.value.field == "amplify_first_chunk"


def test_the_switch_reaches_the_engine_alike_from_the_cli_the_python_api_and_http(distilled, folder, tmp_path,
                                                                                   capsys):
    """The equivalence rule's three paths for the `distilled` block (test_equivalence_request.py exempts it here):
    `--amplify-first-chunk`, `amplify_first_chunk=True` and the JSON extension field give the same resolved request
    and the same frames."""
    from tests.helpers.three_paths import CliServer, Outcome, assert_same_outcome, run_cli

    api = Outcome(distilled.engine.instance.deploy, distilled.generate(PROMPT, amplify_first_chunk=True, **SHORT))
    cli = run_cli(["--model", str(folder), "--prompt", PROMPT, "--frames", "5", "--steps", "2", "--seed", "3",
                   "--height", "32", "--width", "64", "--amplify-first-chunk"], tmp_path / "cli.mp4", capsys)
    server = CliServer(["--model", str(folder)], tmp_path / "data")
    try:
        assert server.url is not None, f"vidloom serve exited with {server.code}"
        http = server.run({"prompt": PROMPT, "size": "64x32"},
                          {"num_frames": 5, "num_inference_steps": 2, "seed": 3, "amplify_first_chunk": True})
    finally:
        server.stop()
    plain = distilled.generate(PROMPT, **SHORT).frames
    for outcome in (api, cli, http):  # the switch took effect on every path: not the plain run's frames
        assert outcome.output is not None, outcome.error
        assert not np.array_equal(outcome.output.frames, plain)
    assert_same_outcome(api, cli, "amplify_first_chunk: CLI vs Python API")
    assert_same_outcome(api, http, "amplify_first_chunk: HTTP vs Python API")
