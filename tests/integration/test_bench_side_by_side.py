"""bench/report.py's side-by-side table: every family has a row group with a reference, and its arithmetic
(speed-ups against the reference default and the same dtype, chat token agreement) is what the docs say."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from chat_streams import token_match  # noqa: E402
from family_bench import FAMILIES  # noqa: E402
from side_by_side import SETTINGS, _ratios, peak_rss_mib  # noqa: E402


def test_every_family_has_a_mid_size_row_group_with_its_reference():
    expected = {"wan2.1-mid": "WanPipeline", "wan2.2-ti2v-mid": "WanPipeline", "far-mid": "AnyFlowFARPipeline",
                "flux2-klein-mid": "Flux2KleinPipeline", "ltx2-mid": "LTX2Pipeline",
                "cosmos3-mid": "Cosmos3OmniPipeline", "cosmos3-chat-mid": "generate",
                "hunyuan15-mid": "HunyuanVideo15Pipeline", "helios-mid": "HeliosPipeline"}
    expected["qwen-image-mid"] = "QwenImagePipeline"
    expected["qwen3-omni-chat-mid"] = "generate"
    expected["stable-audio-mid"] = "StableAudioPipeline"
    assert {name: f.pipeline for name, f in FAMILIES.items()} == expected
    for bench in FAMILIES.values():
        assert callable(bench.chat_reference) if bench.pipeline == "generate" else callable(bench.reference_call)
        if bench.pipeline == "generate":
            continue
        request = bench.vidloom_request(bench.request["steps"])
        if bench.output == "audio":  # a clip of `seconds`, no frame fields (an audio card refuses them)
            assert request.option("seconds") == bench.request["seconds"]
        else:
            assert (request.height, request.width) == (bench.request["height"], bench.request["width"])
    assert SETTINGS == ("vidloom default", "vidloom float32", "reference float32", "reference bfloat16")


# A smoke run of the newest rows at a tiny size and one step: the mid checkpoint writes, and the reference call is
# the request vidloom runs (float32 frames agree as in the families' parity tests).
TINY_ROWS = {"hunyuan15-mid": dict(height=64, width=64, num_frames=5), "helios-mid": dict(height=32, width=32,
                                                                                          num_frames=33)}


@pytest.mark.parametrize("name", list(TINY_ROWS))
def test_the_reference_call_runs_the_request_vidloom_runs(name, tmp_path):
    import dataclasses

    import diffusers
    import torch

    from vidloom.generator import VideoGenerator

    bench = FAMILIES[name]
    bench = dataclasses.replace(bench, request={**bench.request, **TINY_ROWS[name], "steps": 1})
    bench.write(tmp_path / name)
    ours = VideoGenerator.from_pretrained(tmp_path / name, device="cpu", dtype="float32").engine.run(
        bench.vidloom_request(1))["video"]
    pipe = getattr(diffusers, bench.pipeline).from_pretrained(str(tmp_path / name), dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    with torch.inference_mode():
        theirs = np.asarray(bench.reference_call(pipe, bench.request, 1), dtype=np.float32)
    assert ours.shape == theirs.shape and np.abs(ours - theirs).max() < 1e-4


def test_speedups_against_the_reference_default_and_the_same_dtype():
    rows = {
        "vidloom default": dict(dtype="bfloat16", wall_s=2.0, cpu_s=1.0),
        "vidloom float32": dict(dtype="float32", wall_s=4.0, cpu_s=4.0),
        "reference float32": dict(dtype="float32", wall_s=8.0, cpu_s=6.0),
        "reference bfloat16": dict(dtype="bfloat16", wall_s=3.0, cpu_s=1.5),
        "broken": dict(error="exit 1"),
    }
    _ratios(rows)
    ours = rows["vidloom default"]
    assert (ours["wall_speedup_vs_reference_default"], ours["cpu_speedup_vs_reference_default"]) == (4.0, 6.0)
    assert (ours["wall_speedup_vs_reference_same_dtype"], ours["cpu_speedup_vs_reference_same_dtype"]) == (1.5, 1.5)
    assert rows["vidloom float32"]["wall_speedup_vs_reference_same_dtype"] == 2.0  # against reference float32
    assert "wall_speedup_vs_reference_default" not in rows["broken"]


def test_chat_speedups_are_tokens_per_second_and_cpu_per_token():
    rows = {
        "vidloom default": dict(dtype="bfloat16", wall_s=2.0, cpu_s=1.0, tokens=200, tokens_per_s=100.0),
        "reference float32": dict(dtype="float32", wall_s=4.0, cpu_s=3.0, tokens=200, tokens_per_s=50.0),
    }
    _ratios(rows)
    assert rows["vidloom default"]["wall_speedup_vs_reference_default"] == 2.0
    assert rows["vidloom default"]["cpu_speedup_vs_reference_default"] == 3.0
    assert rows["vidloom default"]["wall_speedup_vs_reference_same_dtype"] is None  # no bf16 reference row


def test_the_qwen3_omni_chat_reference_is_greedy_generate_on_a_left_padded_batch(tmp_path):
    """The chat row's transformers side on the tests' tiny thinker: one left-padded batch of two conversations gives
    vidloom's greedy ids for each (so the row's token agreement compares like with like)."""
    from chat_streams import _messages, qwen3_omni_reference
    from tests.helpers.qwen3_omni_checkpoints import write_tiny_thinker
    from vidloom.generator import VideoGenerator

    folder = write_tiny_thinker(tmp_path / "thinker")
    reference = qwen3_omni_reference(folder, "float32")([_messages(0), _messages(1)])
    gen = VideoGenerator.from_pretrained(str(folder), device="cpu", dtype="float32")
    ours = [list(gen.chat(_messages(i), max_tokens=48, temperature=0.0).token_ids) for i in range(2)]
    assert ours == reference  # the two prompts differ in length: the shorter one ran left-padded


def test_token_match_counts_the_shared_greedy_prefix():
    reference = np.array([[1, 2, 3, 4], [5, 6, -1, -1]])
    assert token_match(reference, reference) == 1.0
    ours = np.array([[1, 2, 9, 4], [5, 6, 7, -1]])  # first stream diverges after 2 of 4; second matches its 2
    assert token_match(ours, reference) == 0.75


def test_peak_rss_is_this_process_own():
    assert 10 < peak_rss_mib() < 1 << 20


def _spin(cpu_s: float) -> None:
    """Burns `cpu_s` of this process's CPU time (load on the machine does not change it)."""
    import time

    end = time.process_time() + cpu_s
    while time.process_time() < end:
        pass


def test_phase_split_attributes_cpu_time_to_the_outermost_component_call():
    import torch

    from phase_split import timed_phases

    class Work(torch.nn.Module):
        def __init__(self, cpu_s: float, inner: torch.nn.Module | None = None) -> None:
            super().__init__()
            self.cpu_s, self.inner = cpu_s, inner

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            _spin(self.cpu_s)
            return self.inner(x) if self.inner is not None else x

    class TextWrapper:  # like vidloom's text encoders: not a Module, holds one
        def __init__(self) -> None:
            self.model = Work(0.05)

    vae = Work(0.04, inner=Work(0.04))  # nested: counted once, 0.08 in all
    components = {"text_encoder": TextWrapper(), "transformer": Work(0.03), "vae": vae, "scheduler": object()}

    def generate() -> str:
        components["text_encoder"].model(torch.zeros(1))
        for _ in range(4):
            components["transformer"](torch.zeros(1))
            _spin(0.01)  # a scheduler step: other
        vae(torch.zeros(1))
        Work(0.05)(torch.zeros(1))  # a module of no component: other
        return "frames"

    result, split = timed_phases(components, generate)
    assert result == "frames"
    expected = {"text_encode": 0.05, "denoise": 0.12, "decode": 0.08, "other": 0.09}
    for phase, cpu_s in expected.items():
        assert abs(split[phase]["cpu_s"] - cpu_s) < 0.02, (phase, split)
    assert split["threads"] == 1 and split["hook_calls"] == 8
    # Hooks are removed afterwards: another call is not counted.
    components["transformer"](torch.zeros(1))
    assert timed_phases({}, lambda: None)[1]["hook_calls"] == 0


def test_phase_compare_times_its_rows_with_the_same_hooks():
    import torch

    from phase_compare import timed_row

    transformer = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    components = {"transformer": transformer, "vae": torch.nn.Identity(), "scheduler": object()}

    def run(steps: int) -> np.ndarray:
        x = torch.zeros(1, 4)
        with torch.no_grad():
            for _ in range(steps):
                x = transformer(x)  # its two children are nested: one outermost call per step
            _spin(0.05)  # a scheduler's work: other
            return components["vae"](x).numpy()

    frames, row = timed_row((components, run), 3)
    assert frames.shape == (1, 4)
    assert set(row) == {"text_cpu_s", "denoise_cpu_s", "decode_cpu_s", "denoise_per_step_cpu_s", "other_cpu_s",
                        "total_cpu_s", "wall_s", "loadavg_1m", "transformer_calls", "hook_calls"}
    assert row["transformer_calls"] == 3 and row["hook_calls"] == 3 * 3 + 1
    assert row["other_cpu_s"] >= 0.04 and row["total_cpu_s"] >= row["other_cpu_s"] + row["denoise_cpu_s"] - 0.01


def test_per_phase_table_gives_each_phase_speedup_at_the_same_dtype():
    from side_by_side import phase_markdown

    def row(dtype: str, text: float, denoise: float, decode: float) -> dict:
        phases = {"text_encode": text, "denoise": denoise, "decode": decode, "other": 0.1}
        return {"dtype": dtype, "phases": {k: {"cpu_s": v, "wall_s": v} for k, v in phases.items()}}

    table = {"wan2.1-mid": {"settings": {
        "vidloom default": row("bfloat16", 0.5, 4.0, 2.0), "reference float32": row("float32", 1.0, 8.0, 6.0),
        "reference bfloat16": row("bfloat16", 0.5, 6.0, 1.0), "broken": {"error": "exit 1"}}}}
    lines = phase_markdown(table).splitlines()
    assert len(lines) == 2 + 3
    assert lines[2] == "| wan2.1-mid | vidloom default | bfloat16 | 0.50 | 4.00 | 2.00 | 0.10 | 1.00x / 1.50x / 0.50x |"
