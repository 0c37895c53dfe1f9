"""Taps: keys carry step and call, the filter and byte budget bound what is kept, hooks record per call."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from torch import nn

from vidloom.parity.taps import BlockList, ModuleTaps, RuntimeTaps, TapFilter, TapKey, TapRecorder


class Pair(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return a + 1, b * 2


class Net(nn.Module):
    """A denoiser with one block list whose blocks return two tensors."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Pair(), Pair()])

    def forward(self, x: torch.Tensor, scale: float, text: torch.Tensor) -> torch.Tensor:
        a, b = x, text
        for block in self.blocks:
            a, b = block(a, b)
        return a * scale + b.sum()


def test_keys_carry_loop_step_and_call_and_keep_execution_order():
    rec = TapRecorder()
    rec.record("stage", "encode.embeds", torch.zeros(2))
    rec.begin_step("denoise", 3)
    rec.begin_call()
    rec.record("block", "blocks.0", torch.ones(2))
    rec.record("latents", "latents", np.ones(3, dtype=np.float32))
    rec.end_step()
    assert list(rec.taps) == [
        TapKey("stage", "encode.embeds"),
        TapKey("block", "blocks.0", "denoise", 3, 0),
        TapKey("latents", "latents", "denoise", 3, None),
    ]
    assert TapKey("block", "blocks.0", "denoise", 3, 0).label() == "denoise step 3 call 0 block blocks.0"
    assert TapKey("stage", "decode.video").label() == "stage decode.video"


def test_recorded_tensors_are_copies_on_the_cpu():
    rec = TapRecorder()
    value = torch.zeros(3)
    rec.record("stage", "x", value)
    value.add_(1)
    assert rec.taps[TapKey("stage", "x")].sum() == 0


def test_filter_keeps_only_the_kinds_and_steps_asked_for():
    rec = TapRecorder(TapFilter(kinds=frozenset({"block", "stage"}), steps=frozenset({1})))
    rec.record("stage", "s", torch.zeros(1))
    for step in range(3):
        rec.begin_step("denoise", step)
        rec.begin_call()
        rec.record("block", "blocks.0", torch.zeros(1))
        rec.record("output", "prediction", torch.zeros(1))
        rec.end_step()
    assert [k.label() for k in rec.taps] == ["stage s", "denoise step 1 call 0 block blocks.0"]


def test_byte_budget_stops_recording_and_says_where():
    rec = TapRecorder(TapFilter(max_bytes=3 * 4 * 10))  # room for three float32 tensors of 10
    for index in range(5):
        rec.record("stage", f"t{index}", torch.zeros(10))
    assert len(rec.taps) == 3 and rec.nbytes == 120
    assert rec.dropped == 2 and rec.first_dropped == TapKey("stage", "t3")


@pytest.mark.parametrize("fields, message", [
    (dict(kinds=frozenset({"blocks"})), "taps: unknown kinds ['blocks']"),
    (dict(kinds=frozenset()), "taps: unknown kinds (none given)"),
    (dict(max_bytes=0), "tap_budget: must be > 0"),
])
def test_filter_refuses_bad_settings_by_name(fields, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        TapFilter(**fields)


def test_module_taps_record_inputs_blocks_and_output_per_call_only_inside_steps():
    net, rec = Net(), TapRecorder()
    taps = ModuleTaps(rec, net, {"x": "latents", "text": "text"}, {"layers": BlockList("blocks", ("a", "b"))})
    x, text = torch.ones(2), torch.full((2,), 3.0)
    net(x, 1.0, text)  # outside a step: nothing recorded
    assert rec.taps == {}
    rec.begin_step("denoise", 0)
    net(x, 2.0, text=text)  # kwargs are bound by name too
    net(x, 1.0, text)
    rec.end_step()
    taps.close()
    net(x, 1.0, text)  # hooks removed
    names = [(k.call, k.kind, k.name) for k in rec.taps]
    per_call = [("input", "latents"), ("input", "text"), ("block", "layers.0.a"), ("block", "layers.0.b"),
                ("block", "layers.1.a"), ("block", "layers.1.b"), ("output", "prediction")]
    assert names == [(0, *n) for n in per_call] + [(1, *n) for n in per_call]
    assert torch.equal(rec.taps[TapKey("block", "layers.1.b", "denoise", 0, 1)], text * 4)
    assert torch.equal(rec.taps[TapKey("output", "prediction", "denoise", 0, 0)], (x + 2) * 2 + (text * 4).sum())


def test_a_call_through_the_stages_not_forward_still_counts_at_its_first_block():
    net, rec = Net(), TapRecorder()
    taps = ModuleTaps(rec, net, {"x": "latents"}, {"layers": BlockList("blocks", ("a", "b"))})
    x = torch.ones(2)
    rec.begin_step("denoise", 0)
    net(x, 1.0, x)  # forward: call 0
    for call in range(2):  # a staged caller (step cache, per-request view) runs the blocks itself: calls 1, 2
        a, b = x, x
        for block in net.blocks:
            a, b = block(a, b)
    net(x, 1.0, x)  # forward again: call 3, counted once although its first block also runs
    rec.end_step()
    taps.close()
    calls = {k.call for k in rec.taps if k.name == "layers.0.a"}
    assert calls == {0, 1, 2, 3}
    assert {k.call for k in rec.taps if k.kind == "input"} == {0, 3}


def test_a_joint_stream_block_is_split_into_named_streams_by_its_length_argument():
    class Joint(nn.Module):
        def forward(self, h: torch.Tensor, first: int) -> torch.Tensor:
            return torch.cat([h[:, :first] + 1, h[:, first:] * 2], dim=1)

    class JointNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList([Joint()])

        def forward(self, h: torch.Tensor) -> torch.Tensor:
            return self.blocks[0](h, first=2)  # by keyword: bound by name like a positional one

    net, rec = JointNet(), TapRecorder()
    taps = ModuleTaps(rec, net, {}, {"double": BlockList("blocks", ("txt", "img"), split_by="first")})
    h = torch.ones(1, 5, 3)
    rec.begin_step("denoise", 0)
    net(h)
    rec.end_step()
    taps.close()
    assert torch.equal(rec.taps[TapKey("block", "double.0.txt", "denoise", 0, 0)], torch.full((1, 2, 3), 2.0))
    assert torch.equal(rec.taps[TapKey("block", "double.0.img", "denoise", 0, 0)], torch.full((1, 3, 3), 2.0))


def test_runtime_taps_record_state_latents_after_each_step_and_node_slots():
    class State:
        latents = torch.full((2,), 5.0)

    class Plan:
        loop, index = "denoise", 4

    rec = TapRecorder()
    watch = RuntimeTaps(rec)
    watch.node_finished("prepare", {"latents": torch.zeros(2), "generator": torch.Generator(), "note": "x"})
    watch.step_started(Plan())
    assert rec.in_step and rec.step == 4
    watch.step_finished(Plan(), None, State())
    assert not rec.in_step
    assert list(rec.taps) == [TapKey("stage", "prepare.latents"), TapKey("latents", "latents", "denoise", 4)]


def test_block_output_names_pick_and_skip_streams():
    """One name on a one-tensor block suffixes it; an empty name skips a stream the other side lacks."""

    class Single(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList([nn.Identity()])

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.blocks[0](x)

    single, pair, rec = Single(), Net(), TapRecorder()
    taps = [ModuleTaps(rec, single, {}, {"layers": BlockList("blocks", ("gen",))}),
            ModuleTaps(rec, pair, {}, {"other": BlockList("blocks", ("", "b"))})]
    rec.begin_step("denoise", 0)
    single(torch.ones(2, 3))
    pair(torch.ones(2), 1.0, torch.ones(2))
    rec.end_step()
    for tap in taps:
        tap.close()
    assert [k.name for k in rec.taps if k.kind == "block"] == ["layers.0.gen", "other.0.b", "other.1.b"]
    assert rec.taps[TapKey("block", "layers.0.gen", "denoise", 0, 0)].shape == (2, 3)


def test_runtime_taps_skip_other_loops_and_read_latents_through_a_function():
    class State:
        video = torch.full((2,), 7.0)

    class Plan:
        def __init__(self, loop: str) -> None:
            self.loop, self.index = loop, 0

    rec = TapRecorder()
    watch = RuntimeTaps(rec, frozenset({"stage1"}), lambda state: state.video * 2)
    watch.step_started(Plan("prefix_prefill"))  # not the family's loop: nothing recorded
    assert not rec.in_step
    watch.step_finished(Plan("prefix_prefill"), None, State())
    watch.step_started(Plan("stage1"))
    watch.step_finished(Plan("stage1"), None, State())
    assert list(rec.taps) == [TapKey("latents", "latents", "stage1", 0)]
    assert torch.equal(rec.taps[TapKey("latents", "latents", "stage1", 0)], torch.full((2,), 14.0))


def test_batched_calls_split_by_rows_into_the_other_sides_calls():
    """A reference forward batching [uncond, cond] (rows (1, 0)) is recorded as our call 0 (cond) and call 1."""
    rec = TapRecorder()
    net = Net()
    taps = ModuleTaps(rec, net, {"x": "x"}, {"blocks": BlockList("blocks", ("a", "b"))}, rows=(1, 0))
    x = torch.stack([torch.zeros(3), torch.ones(3)])  # row 0 uncond, row 1 cond
    rec.begin_step("denoise", 0)
    net(x, 1.0, x.clone())
    net(torch.full((1, 3), 5.0), 1.0, torch.zeros(1, 3))  # a later forward of one row: the next free call
    rec.end_step()
    taps.close()
    assert torch.equal(rec.taps[TapKey("input", "x", "denoise", 0, 0)], torch.ones(1, 3))
    assert torch.equal(rec.taps[TapKey("input", "x", "denoise", 0, 1)], torch.zeros(1, 3))
    assert torch.equal(rec.taps[TapKey("block", "blocks.1.a", "denoise", 0, 0)], torch.full((1, 3), 3.0))
    assert torch.equal(rec.taps[TapKey("input", "x", "denoise", 0, 2)], torch.full((1, 3), 5.0))


def test_token_taps_have_no_call():
    rec = TapRecorder()
    rec.begin_step("talker", 4)
    rec.record("token", "id", torch.tensor([812]))
    rec.end_step()
    assert list(rec.taps) == [TapKey("token", "id", "talker", 4, None)]
