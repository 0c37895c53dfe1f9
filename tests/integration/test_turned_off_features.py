"""A deployed feature that another turns off for a request is reported, never dropped silently: the result's metadata
names it under "disabled" with the reason, and one log line says it (runtime/turned_off.py)."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from tests.helpers.batched_runs import serve_batched
from tests.helpers.adapter_checkpoints import write_tiny_pipeline
from tests.helpers.graph_capturer import RecordingCapturer
from tests.helpers.lora_files import WAN_LORA as SPEC, WAN_LORA_REQUEST as KW, write_lora
from tests.helpers.wan_checkpoints import TINY_A, write_tiny_wan
from vidloom.core.deploy import DeployConfig
from vidloom.core.request import GenerationRequest
from vidloom.families.stable_audio.demo import DEMO_ID, ensure_demo_checkpoint
from vidloom.generator import VideoGenerator, build_request
from vidloom.runtime.engine import Engine

LOGGER = "vidloom.runtime.request_run"


@pytest.fixture(scope="module")
def audio(tmp_path_factory) -> VideoGenerator:
    pytest.importorskip("torchsde")
    cache = tmp_path_factory.mktemp("stable-audio-off")
    ensure_demo_checkpoint(cache)
    return VideoGenerator.from_pretrained(DEMO_ID, device="cpu", cache_dir=cache)


def _redeployed(plain: VideoGenerator, capturer: RecordingCapturer | None = None, **deploy) -> VideoGenerator:
    """The same loaded model under other deploy options (cuda_graphs via a CPU stand-in capturer)."""
    engine = plain.engine
    instance = dataclasses.replace(engine.instance, deploy=dataclasses.replace(engine.instance.deploy, **deploy))
    return VideoGenerator(Engine(instance, engine.program, engine.adapters, capturer=capturer))


def _disabled(lines: list[logging.LogRecord], feature: str) -> list[str]:
    return [r.getMessage() for r in lines if f"runs without {feature}:" in r.getMessage()]


def test_a_step_cache_turns_cuda_graphs_off_and_says_so(audio, caplog):
    capturer = RecordingCapturer()
    gen = _redeployed(audio, capturer, cuda_graphs=True, step_cache="fbcache")
    with caplog.at_level(logging.INFO, logger=LOGGER):
        out = gen.generate("a dog barks", seconds=0.5, num_inference_steps=3, seed=1)
    assert capturer.calls == 0  # no step was captured or replayed
    assert "step cache 'fbcache'" in out.metadata["disabled"]["cuda_graphs"]
    assert len(_disabled(caplog.records, "cuda_graphs")) == 1


def test_graphs_that_do_not_fit_the_memory_budget_run_eagerly_and_say_so(audio, caplog):
    """A step whose graph would keep more than the request memory budget has free runs eagerly (runtime.graph_memory),
    with the same result as without graphs; the run's metadata and one log line say why."""
    capturer = RecordingCapturer()
    gen = _redeployed(audio, capturer, cuda_graphs=True)
    gen.engine.admission.budget_bytes = 1  # the request alone is still admitted (an idle engine); no graph fits
    with caplog.at_level(logging.INFO, logger=LOGGER):
        out = gen.generate("a dog barks", seconds=0.5, num_inference_steps=3, seed=1)
    eager = audio.generate("a dog barks", seconds=0.5, num_inference_steps=3, seed=1)
    assert capturer.calls == 0 and gen.engine.graph_stats["captures"] == 0
    assert "request memory budget" in out.metadata["disabled"]["cuda_graphs"]
    assert len(_disabled(caplog.records, "cuda_graphs")) == 1
    assert (out.audio == eager.audio).all()
    assert gen.engine.admission.in_use == 0


def test_graphs_alone_never_keep_out_a_request_that_fits_without_them(audio):
    """On an engine where only captured graphs hold the ledger, a request it has no room for drops them and runs (its
    own steps then eager where their graphs do not fit beside it) instead of waiting for room nothing would free."""
    gen = _redeployed(audio, RecordingCapturer(), cuda_graphs=True)
    gen.generate("a dog barks", seconds=0.5, num_inference_steps=3, seed=1)
    ledger = gen.engine.admission
    held = ledger.held_by("cuda graphs")
    assert held > 0 and ledger.in_use == held  # the graphs outlive their request, charged
    ledger.budget_bytes = held  # full: no request fits beside the graphs
    out = gen.generate("a dog barks", seconds=0.5, num_inference_steps=3, seed=1)
    assert "request memory budget" in out.metadata["disabled"]["cuda_graphs"]
    assert ledger.in_use == 0 and gen.engine.graph_stats["captures"] > 0


def test_graphs_alone_turn_nothing_off(audio):
    capturer = RecordingCapturer()
    out = _redeployed(audio, capturer, cuda_graphs=True).generate("a dog barks", seconds=0.5, num_inference_steps=3,
                                                                  seed=1)
    assert capturer.calls > 0 and "disabled" not in out.metadata


def test_a_step_cache_under_the_batch_policy_runs_alone_and_says_so(audio, caplog):
    gen = _redeployed(audio, step_cache="fbcache")
    requests = [build_request(gen.card, p, seconds=0.5, num_inference_steps=2, seed=s)
                for p, s in (("a dog barks", 1), ("rain", 2))]
    with caplog.at_level(logging.INFO, logger=LOGGER):
        outs, stats = serve_batched(gen.engine, requests)
    assert stats["largest_batch"] == 1
    for out in outs:
        assert out.metadata["disabled"] == {"batching": "step cache 'fbcache': each request decides for itself "
                                                        "which blocks run"}
    assert len(_disabled(caplog.records, "batching")) == 2  # one line per request, not per step


def test_a_family_without_batching_says_each_request_ran_alone(tmp_path_factory, caplog):
    """An adapted diffusers pipeline (the runtime does not reach inside its step) under the batch policy."""
    gen = VideoGenerator.from_pretrained(write_tiny_pipeline(tmp_path_factory.mktemp("cog-off") / "cog", "cogvideox"),
                                         device="cpu")
    assert "batching" not in gen.card.capabilities.supported
    why = gen.card.capabilities.why_not["batching"]
    requests = [GenerationRequest(prompt=p, height=16, width=16, num_frames=5, num_inference_steps=2, seed=s)
                for p, s in (("a fox", 1), ("a cat", 2))]
    with caplog.at_level(logging.INFO, logger=LOGGER):
        outs, _ = serve_batched(gen.engine, requests)
    assert [out.metadata["disabled"] for out in outs] == [{"batching": why}] * 2
    assert all(why in line for line in _disabled(caplog.records, "batching"))


def test_lora_adapters_turn_compile_off_and_say_so(tmp_path_factory, caplog):
    folder = write_tiny_wan(tmp_path_factory.mktemp("wan-off"), TINY_A)
    lora = write_lora(folder, "WanPipeline", SPEC, tmp_path_factory.mktemp("loras-off"))
    gen = VideoGenerator.from_pretrained(folder, device="cpu", deploy=DeployConfig(compile=True,
                                                                                   compile_backend="eager"))
    gen.load_lora("a", lora)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        adapted = gen.generate("a kite", loras={"a": 1.0}, **KW)
        plain = gen.generate("a kite", **KW)
    assert "LoRA adapters" in adapted.metadata["disabled"]["compile"]
    assert "disabled" not in plain.metadata
    assert len(_disabled(caplog.records, "compile")) == 1
