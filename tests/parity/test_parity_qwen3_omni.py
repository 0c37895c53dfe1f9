"""Qwen3-Omni through the parity tool: the thinker's reply ids position by position (exactly) and its first
next-token logits within 1e-4, against transformers' generate() on a tiny folder; a nudged lm head is named in
the thinker at its first divergent position."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.qwen3_omni_checkpoints import THINKER_B, write_tiny_thinker
from vidloom.cli import main
from vidloom.core.errors import InvalidRequest
from vidloom.families.qwen3_omni.parity import QWEN3_OMNI
from vidloom.generator import VideoGenerator
from vidloom.parity import Tolerance, run_parity
from vidloom.parity.sequences import SequenceReference

LOGITS = Tolerance(atol=1e-4, rtol=0.0)  # float32 both sides (tests/parity/test_qwen3_omni_thinker.py)
QUESTION, SEED, MAX_TOKENS = "tell me about kites", 3, 10


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    folder = write_tiny_thinker(tmp_path_factory.mktemp("parity-q3"), THINKER_B)
    yield folder, VideoGenerator.from_pretrained(str(folder)), SequenceReference.load(folder, "cpu", QWEN3_OMNI)
    torch.set_num_threads(threads)


def _run(tiny):
    folder, gen, reference = tiny
    request = QWEN3_OMNI.build_request(QUESTION, SEED, MAX_TOKENS)
    return run_parity(folder, request, generator=gen, reference=reference, tolerance=LOGITS)


def test_reply_ids_and_first_logits_match(tiny):
    report = _run(tiny).report
    assert report.ok, report.format()
    assert sum(d.key.loop == "thinker" for d in report.diffs) == MAX_TOKENS, report.format()
    assert [d.key.name for d in report.diffs if d.key.kind == "stage"] == ["thinker.first_logits"]


def test_nudged_lm_head_is_named_in_the_thinker(tiny):
    _, gen, _ = tiny
    head = gen.engine.instance["thinker"].head
    noise = torch.randn(head.weight.shape, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        head.weight.add_(noise)
    try:
        report = _run(tiny).report
    finally:
        with torch.no_grad():
            head.weight.sub_(noise)
    first = report.first_divergence
    assert first is not None and (first.key.kind, first.key.loop) == ("token", "thinker"), report.format()


def test_command_reports_no_divergence(tiny, capsys):
    folder, _, _ = tiny
    code = main(["parity", "--model", str(folder), "--prompt", QUESTION, "--seed", str(SEED),
                 "--max-tokens", str(MAX_TOKENS), "--rtol", "0"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "up to 10 reply tokens, greedy" in out and "parity: no divergence over" in out


def test_sampled_decoding_is_refused_by_name(tiny):
    folder, gen, reference = tiny
    request = QWEN3_OMNI.build_request(QUESTION, SEED, MAX_TOKENS)
    hot = type(request)(request.messages, type(request.sampling)(temperature=0.7, max_tokens=4))
    with pytest.raises(InvalidRequest, match="temperature"):
        run_parity(folder, hot, generator=gen, reference=reference)
