"""`vidloom generate --action-mode ...` on a tiny Cosmos3 folder with the action pathway: the same actions and
frames as the Python API, written as .npy / .json; bad flags refused before loading, naming the flag."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vidloom import ActionInput, cli
from vidloom.generator import VideoGenerator

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
COMMON = ["--prompt", "push the block", "--steps", "2", "--seed", "9", "--resolution-tier", "256"]


@pytest.fixture(scope="module")
def first_frame(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("frame") / "first.png"
    Image.fromarray(np.random.default_rng(3).integers(0, 256, (48, 64, 3), dtype=np.uint8)).save(path)
    return path


def _cli(folder: Path, tmp_path: Path, *argv: str) -> int:
    return cli.main(["generate", "--model", str(folder), "--device", "cpu", "-o", str(tmp_path / "out.mp4"),
                     *COMMON, *argv])


def test_policy_writes_the_api_s_actions(cosmos3_action_dir: Path, first_frame: Path, tmp_path: Path):
    npy, as_json = tmp_path / "acts.npy", tmp_path / "acts.json"
    for target in (npy, as_json):
        assert _cli(cosmos3_action_dir, tmp_path, "--image", str(first_frame), "--action-mode", "policy",
                    "--domain", "pusht", "--chunk-size", "4", "--actions-out", str(target)) == 0
    with VideoGenerator.from_pretrained(cosmos3_action_dir, device="cpu") as gen:
        api = gen.generate("push the block", image=Image.open(first_frame), num_inference_steps=2, seed=9,
                           action=ActionInput(mode="policy", domain_name="pusht", chunk_size=4, resolution_tier=256))
    written = np.load(npy, allow_pickle=False)
    assert written.dtype == np.float32 and written.shape == (4, 2)
    assert np.abs(written - api.actions).max() <= 1e-6
    body = json.loads(as_json.read_text())
    assert body["shape"] == [4, 2] and body["domain_name"] == "pusht"
    assert np.allclose(np.asarray(body["actions"], dtype=np.float32), written, atol=1e-6)


def test_forward_dynamics_reads_actions_from_json(cosmos3_action_dir: Path, first_frame: Path, tmp_path: Path):
    actions = tmp_path / "in.json"
    actions.write_text(json.dumps({"actions": [[0.5, -0.5]] * 4}))
    assert _cli(cosmos3_action_dir, tmp_path, "--image", str(first_frame), "--action-mode", "forward_dynamics",
                "--domain", "pusht", "--actions", str(actions)) == 0
    assert (tmp_path / "out.mp4").stat().st_size > 0


@pytest.mark.parametrize("argv, flag", [
    (["--domain", "pusht"], "--action-mode"),
    (["--action-mode", "policy"], "--domain"),
    (["--action-mode", "forward_dynamics", "--domain", "pusht", "--actions", "missing.npy"], "--actions"),
    (["--action-mode", "forward_dynamics", "--domain", "pusht", "--actions-out", "x.npy"], "--actions-out"),
    (["--action-mode", "policy", "--domain", "pusht", "--actions-out", "x.txt"], "--actions-out"),
    (["--action-mode", "policy", "--domain", "mars_rover"], "--domain"),
    (["--action-mode", "policy", "--domain", "pusht", "--chunk-size", "6"], "--chunk-size"),
])
def test_bad_action_flags_are_refused_naming_the_flag(cosmos3_action_dir: Path, first_frame: Path, tmp_path: Path,
                                                      capsys, argv: list[str], flag: str):
    code = _cli(cosmos3_action_dir, tmp_path, "--image", str(first_frame), *argv)
    err = capsys.readouterr().err
    assert code != 0 and f"error: {flag}:" in err, err
    assert not (tmp_path / "out.mp4").exists()
