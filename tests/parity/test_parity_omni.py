"""Qwen2.5-Omni through the parity tool: thinker tokens and talker codes position by position (exactly), the
waveform within 1e-4 (the speech parity test's bound), against transformers' generate() on a tiny folder.

A nudged talker head makes the talker choose another code: the report names the talker and the position,
while every thinker token still matches. A nudged thinker head is named in the thinker.
"""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch

from tests.helpers.qwen_omni_checkpoints import OMNI_A, write_tiny_omni
from vidloom.cli import main
from vidloom.core.errors import InvalidRequest
from vidloom.generator import VideoGenerator
from vidloom.parity import Tolerance, run_parity
from vidloom.families.qwen_omni.parity import QWEN_OMNI as OMNI
from vidloom.parity.sequences import SequenceReference

WAVE = Tolerance(atol=1e-4, rtol=0.0)
QUESTION = "what is a kite?"  # both tiny talkers speak a while after it
MAX_TOKENS, SEED = 10, 7


@pytest.fixture(scope="module")
def omni(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the reference is far slower with two threads on a shared CPU
    folder = write_tiny_omni(tmp_path_factory.mktemp("parity-omni"), OMNI_A)
    yield folder, VideoGenerator.from_pretrained(str(folder)), SequenceReference.load(folder, "cpu", OMNI)
    torch.set_num_threads(threads)


@contextmanager
def nudged(linear: torch.nn.Linear, scale: float):
    noise = torch.randn(linear.weight.shape, generator=torch.Generator().manual_seed(0)) * scale
    with torch.no_grad():
        linear.weight.add_(noise)
    try:
        yield
    finally:
        with torch.no_grad():
            linear.weight.sub_(noise)


def _run(omni, tolerance=WAVE):
    folder, gen, reference = omni
    request = OMNI.build_request(QUESTION, SEED, MAX_TOKENS)
    return run_parity(folder, request, generator=gen, reference=reference, tolerance=tolerance)


def test_tokens_codes_and_waveform_match(omni):
    result = _run(omni)
    report = result.report
    assert report.ok, report.format()
    loops = {d.key.loop for d in report.diffs if d.key.kind == "token"}
    assert loops == {"thinker", "talker"}, report.format()
    assert sum(d.key.loop == "talker" for d in report.diffs) > 3  # codes worth comparing
    assert [d.key.name for d in report.diffs if d.key.kind == "stage"] == ["vocoder.audio"]
    assert result.ours.shape == result.theirs.shape


def test_nudged_talker_head_is_named_at_its_code(omni):
    _, gen, _ = omni
    with nudged(gen.engine.instance["talker"].head, 1.0):
        report = _run(omni).report
    first = report.first_divergence
    assert first is not None, report.format()
    assert (first.key.kind, first.key.loop) == ("token", "talker"), report.format()
    assert first.max_abs >= 1 and first.bound == 0.0
    assert f"first divergence at talker step {first.key.step} token id: ours [" in report.summary()
    thinker = [d for d in report.diffs if d.key.loop == "thinker"]
    assert thinker and not any(d.diverged for d in thinker), report.format()


def test_nudged_thinker_head_is_named_in_the_thinker(omni):
    _, gen, _ = omni
    with nudged(gen.engine.instance["thinker"].head, 1.0):
        report = _run(omni).report
    first = report.first_divergence
    assert first is not None and first.key.loop == "thinker", report.format()


def test_command_reports_no_divergence(omni, capsys):
    folder, _, _ = omni
    code = main(["parity", "--model", str(folder), "--prompt", QUESTION, "--seed", str(SEED),
                 "--max-tokens", str(MAX_TOKENS), "--rtol", "0"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "up to 10 reply tokens and 40 talker codes" in out
    assert "parity: no divergence over" in out and "talker ids" in out and "stage vocoder.audio" in out


def test_sampled_decoding_is_refused_by_name(omni):
    folder, gen, reference = omni
    request = OMNI.build_request(QUESTION, SEED, MAX_TOKENS)
    hot = type(request)(chat=request.chat, seed=SEED, max_audio_tokens=8)  # the default talker samples
    with pytest.raises(InvalidRequest, match="temperature"):
        run_parity(folder, hot, generator=gen, reference=reference)
