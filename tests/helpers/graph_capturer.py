"""A CUDA graph's contract on CPU: a capture records the static inputs; a replay recomputes the output buffers
from whatever they now hold. Drives runtime.cudagraph's plumbing (signatures, static buffers, rebuilt
per-request objects) in CPU tests; the kernels themselves are captured in tests/gpu/."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Callable, Mapping

import torch
from torch.utils._python_dispatch import TorchDispatchMode

if TYPE_CHECKING:
    from vidloom.generator import VideoGenerator


def copy_into(buffer: Any, value: Any) -> None:
    """Write `value` into the output buffers of the same structure (tensors, tuples/lists/dicts, fixed values)."""
    if isinstance(buffer, torch.Tensor):
        buffer.copy_(value)
    elif isinstance(buffer, (tuple, list)):
        assert len(buffer) == len(value)
        for b, v in zip(buffer, value):
            copy_into(b, v)
    elif isinstance(buffer, dict):
        for k, b in buffer.items():
            copy_into(b, value[k])
    else:  # None, or a value fixed at capture (a real graph returns the capture's object every replay)
        assert buffer is value or buffer == value, (buffer, value)


class Replay:
    """One recorded step: `output` is computed at capture; `replay()` recomputes it in place."""

    def __init__(self, call: Callable[..., Any], static: Mapping[str, Any]) -> None:
        self.call, self.static = call, static
        self.output = call(**static)

    def replay(self) -> None:
        copy_into(self.output, self.call(**self.static))


class RecordingCapturer:
    """Counts capture attempts; `fail=True` raises like an uncapturable op would. `ops`: where every aten op the
    captured bodies dispatch (at capture and at each replay) is collected, to check it against UNCAPTURABLE."""

    def __init__(self, fail: bool = False, ops: set[str] | None = None) -> None:
        self.fail, self.ops = fail, ops
        self.calls = 0

    def __call__(self, call: Callable[..., Any], static: Mapping[str, Any]) -> Replay:
        self.calls += 1
        if self.fail:
            raise RuntimeError("operation not permitted when stream is capturing")
        return Replay(call if self.ops is None else self._logged(call), static)

    def _logged(self, call: Callable[..., Any]) -> Callable[..., Any]:
        def logged(**inputs: Any) -> Any:
            with OpLog() as log:
                out = call(**inputs)
            self.ops.update(log.ops)
            return out

        return logged


class Slab:
    """A buffer a step writes into in place and reads back (a KV slab), captured by identity."""

    def __init__(self) -> None:
        self.rows = torch.zeros(4)


class SlabView:
    """A per-request network view binding its slab by identity (as FarNetwork does): forgetting the slab drops the
    graphs recorded over it (StepGraphs.forget)."""

    def __init__(self, slab: Slab) -> None:
        self.slab = slab

    def graph_split(self) -> tuple[tuple[Slab], tuple[()]]:
        return (self.slab,), ()

    def graph_rebuild(self, parts: tuple[()]) -> SlabView:
        return self


def graphed_generator(plain: VideoGenerator, capturer: RecordingCapturer, **deploy: Any) -> VideoGenerator:
    """The same loaded model with cuda_graphs on (and `deploy`'s other fields), its steps recorded by `capturer`
    (the CUDA check is skipped: the card's acceptance of cuda_graphs is checked at load in test_capability_audit)."""
    from vidloom.generator import VideoGenerator
    from vidloom.runtime.engine import Engine

    engine = plain.engine
    instance = dataclasses.replace(engine.instance,
                                   deploy=dataclasses.replace(engine.instance.deploy, cuda_graphs=True, **deploy))
    return VideoGenerator(Engine(instance, engine.program, engine.adapters, capturer=capturer))


UNCAPTURABLE = frozenset({
    "aten.lift_fresh.default",  # torch.tensor(data): a host-to-device copy from memory gone by the replay
    "aten.lift_fresh_copy.default",
    "aten._local_scalar_dense.default",  # .item() / bool(tensor): a device-to-host sync, illegal while capturing
    "aten.item.default",  # float(tensor), .item(): the same read, as a dispatch mode sees it
    "aten.nonzero.default",  # an output size read back from the device
    "aten.repeat_interleave.self_Tensor",  # counts on the device: the output size is read back (no output_size)
    "aten.repeat_interleave.Tensor",
})
"""Ops that fail a CUDA graph capture (or bake a host copy into it); what CPU tests can see of capturability."""


class OpLog(TorchDispatchMode):
    """Every aten op a block of code dispatches (`with OpLog() as log: ...; log.ops`)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: set[str] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        self.ops.add(str(func))
        return func(*args, **(kwargs or {}))


def step_ops(run: Any, ready: Callable[[Any], bool]) -> set[str]:
    """The aten ops of the first plan of `run` that `ready(plan)` accepts, run once under OpLog (the plans before it
    are stepped; the run is closed). The step's attention must be among them: the whole step was seen."""
    try:
        while not (run.prepare() and ready(run.pending_plan)):
            run.step()
        plan = run.pending_plan
        with torch.inference_mode(), OpLog() as log:
            plan.call(**plan.inputs)
    finally:
        run.close()
    assert "aten.scaled_dot_product_attention.default" in log.ops
    return log.ops
