"""Named taps: tensors recorded per stage, per step and per block of a run, bounded in memory.

One recorder serves both sides of a parity check. Our runtime feeds it through its
RunObserver (step boundaries, loop state, program slots); the reference pipeline through
its step callback; on both sides forward hooks on the denoiser and its block lists record
the network's inputs, every block's output and the network's output, per call (a CFG
branch is one call: call 0 = conditional, call 1 = unconditional, as both sides run them).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np
import torch
from torch import Tensor, nn

TAP_KINDS = ("stage", "input", "block", "output", "latents", "token")
"""stage: a slot a program node wrote; input / block / output: the denoiser's arguments, each block's
output and its prediction, per call; latents: the loop state's latents after each step; token: the id an
autoregressive loop chose at a position (compared exactly)."""


@dataclass(frozen=True)
class TapKey:
    """Where a tensor was recorded; `loop`, `step` and `call` are None for stage taps."""

    kind: str
    name: str
    loop: str | None = None
    step: int | None = None
    call: int | None = None

    @property
    def where(self) -> str:
        """The step this tap belongs to ("denoise step 2"), or "stages"."""
        return "stages" if self.step is None else f"{self.loop} step {self.step}"

    def label(self) -> str:
        """"denoise step 2 call 0 block blocks.1", "denoise step 2 latents latents", "stage decode.video"."""
        if self.step is None:
            return f"{self.kind} {self.name}"
        call = "" if self.call is None else f" call {self.call}"
        return f"{self.where}{call} {self.kind} {self.name}"


@dataclass(frozen=True)
class TapFilter:
    """Which taps to keep, and the bytes they may take (recording stops past `max_bytes`)."""

    kinds: frozenset[str] = frozenset(TAP_KINDS)
    steps: frozenset[int] | None = None
    """Step indices to record (None: every step); stage taps are kept regardless."""
    max_bytes: int = 512 << 20

    def __post_init__(self) -> None:
        unknown = sorted(set(self.kinds) - set(TAP_KINDS))
        if unknown or not self.kinds:
            raise ValueError(f"taps: unknown kinds {unknown or '(none given)'}; known: {', '.join(TAP_KINDS)}")
        if self.max_bytes <= 0:
            raise ValueError(f"tap_budget: must be > 0 bytes, got {self.max_bytes}")

    def wants(self, key: TapKey) -> bool:
        if key.kind not in self.kinds:
            return False
        return key.step is None or self.steps is None or key.step in self.steps


class TapRecorder:
    """Tensors by TapKey in the order they were recorded (execution order), copied to the CPU."""

    def __init__(self, keep: TapFilter | None = None) -> None:
        self.keep = keep or TapFilter()
        self.taps: dict[TapKey, Tensor] = {}
        self.nbytes = 0
        self.dropped = 0  # taps past the byte budget
        self.first_dropped: TapKey | None = None
        self.loop: str | None = None
        self.step: int | None = None
        self.call = -1  # the current forward's (first) call
        self._next_call = 0  # a forward holding several calls (CFG rows split) takes several numbers

    @property
    def in_step(self) -> bool:
        return self.step is not None

    def begin_step(self, loop: str, step: int) -> None:
        self.loop, self.step, self.call, self._next_call = loop, step, -1, 0

    def end_step(self) -> None:
        self.loop, self.step, self.call, self._next_call = None, None, -1, 0

    def begin_call(self) -> None:
        self.call = self._next_call
        self._next_call += 1

    def record_rows(self, kind: str, name: str, value: Any, rows: tuple[int, ...]) -> None:
        """A forward that batches several of the other side's calls: batch row rows[i] is recorded as the
        current call + i (a value whose batch is not len(rows) is one call, recorded as `record` does)."""
        tensor = _as_tensor(value)
        if tensor is None or len(rows) < 2 or tensor.ndim == 0 or tensor.shape[0] != len(rows):
            self.record(kind, name, value)
            return
        for offset, row in enumerate(rows):
            self.record(kind, name, tensor[row:row + 1], call=self.call + offset)
        self._next_call = max(self._next_call, self.call + len(rows))

    def record(self, kind: str, name: str, value: Any, call: int | None = None) -> None:
        """Keep `value` (a tensor or array; anything else is skipped) under the current step and call
        (`call`, when given, instead of the current one)."""
        tensor = _as_tensor(value)
        if tensor is None:
            return
        if kind == "stage":
            key = TapKey(kind, name)
        else:
            call = self.call if call is None else call
            key = TapKey(kind, name, self.loop, self.step, None if kind in ("latents", "token") else call)
        if key in self.taps or not self.keep.wants(key):
            return  # a repeated key keeps its first value (execution order decides)
        size = tensor.numel() * tensor.element_size()
        if self.nbytes + size > self.keep.max_bytes:
            self.dropped += 1
            self.first_dropped = self.first_dropped or key
            return
        self.nbytes += size
        self.taps[key] = tensor.detach().to("cpu", copy=True)


def _as_tensor(value: Any) -> Tensor | None:
    if isinstance(value, Tensor):
        return value
    if isinstance(value, np.ndarray) and value.dtype.kind in "fiub":
        return torch.from_numpy(value)
    return None


def _first_tensor(output: Any) -> Tensor | None:
    """A module's prediction: a tensor, the first element of a tuple, or a diffusers output's `sample`."""
    if isinstance(output, Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], Tensor):
        return output[0]
    sample = getattr(output, "sample", None)
    return sample if isinstance(sample, Tensor) else None


@dataclass(frozen=True)
class BlockList:
    """A denoiser's ModuleList of blocks: its attribute, and names for a block's tuple outputs."""

    attr: str
    outputs: tuple[str, ...] = ()
    """Names of the tensors a block returns, in its order (empty: it returns one tensor, recorded under the
    block's name; one name for a block returning one tensor: recorded under `<block>.<name>`). An empty name
    skips that output (a stream the other side's blocks do not carry)."""
    split_by: str = ""
    """A block returning one joint stream of two token streams (ours: [text, image]): the name of its argument
    holding the first stream's token count. The output is split along dim 1 and recorded as `outputs`'s two
    names, as a block returning the two apart would be."""


class ModuleTaps:
    """Forward hooks on a denoiser and its block lists that record while the recorder is in a step.

    `inputs` maps the denoiser's argument names to tap names (the arguments compared); block taps
    are named `<our attr>.<index>[.<output name>]` by `names`, so both sides record the same keys.
    """

    def __init__(
        self,
        recorder: TapRecorder,
        denoiser: nn.Module,
        inputs: Mapping[str, str],
        blocks: Mapping[str, BlockList],
        rows: tuple[int, ...] = (),
        skipped: Callable[[nn.Module, Mapping[str, Any]], bool] | None = None,
    ) -> None:
        """`blocks`: tap name prefix (our attribute) -> this denoiser's block list holding those blocks.
        `rows`: a forward batching the other side's calls (CFG branches) holds call i in batch row rows[i].
        `skipped`: (denoiser, forward kwargs) -> True for a call the other side does not make (not recorded)."""
        self.recorder = recorder
        self._rows = rows
        self._skipped = skipped
        self._skipping = False  # inside a forward `skipped` picked out
        self._signature = inspect.signature(denoiser.forward)
        self._inputs = dict(inputs)
        self._opened = False  # forward began this call; the first block must not begin another
        self._handles = [
            denoiser.register_forward_pre_hook(self._before_call, with_kwargs=True),
            denoiser.register_forward_hook(self._after_call),
        ]
        for list_index, (prefix, spec) in enumerate(blocks.items()):
            for index, block in enumerate(getattr(denoiser, spec.attr)):
                if list_index == 0 and index == 0:
                    self._handles.append(block.register_forward_pre_hook(self._first_block))
                if spec.split_by:
                    hook = self._split_hook(f"{prefix}.{index}", spec.outputs, block, spec.split_by)
                    self._handles.append(block.register_forward_hook(hook, with_kwargs=True))
                    continue
                hook = self._block_hook(f"{prefix}.{index}", spec.outputs)
                self._handles.append(block.register_forward_hook(hook))

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _first_block(self, module: nn.Module, args: tuple[Any, ...]) -> None:
        if self._skipping:
            return
        # A network call that runs the denoiser's stages (embed -> blocks -> head) rather than its forward,
        # as step caches and per-request views do, still begins a call: at its first block.
        if self.recorder.in_step and not self._opened:
            self.recorder.begin_call()
        self._opened = False

    def _before_call(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if not self.recorder.in_step:
            return
        if self._skipped is not None and self._skipped(module, kwargs):
            self._skipping = True
            return
        self.recorder.begin_call()
        self._opened = True
        bound = self._signature.bind_partial(*args, **kwargs).arguments
        for arg, name in self._inputs.items():
            if arg in bound:
                self.recorder.record_rows("input", name, bound[arg], self._rows)

    def _after_call(self, module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if self._skipping:
            self._skipping = False
            return
        if self.recorder.in_step:
            self.recorder.record_rows("output", "prediction", _first_tensor(output), self._rows)

    def _split_hook(self, name: str, outputs: tuple[str, ...], block: nn.Module, split_by: str) -> Any:
        signature = inspect.signature(block.forward)

        def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Tensor) -> None:
            if not self.recorder.in_step:
                return
            first = int(signature.bind_partial(*args, **kwargs).arguments[split_by])
            for part, value in zip(outputs, (output[:, :first], output[:, first:])):
                if part:
                    self.recorder.record_rows("block", f"{name}.{part}", value, self._rows)

        return hook

    def _block_hook(self, name: str, outputs: tuple[str, ...]) -> Any:
        def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            if not self.recorder.in_step or self._skipping:
                return
            if not outputs:
                self.recorder.record_rows("block", name, _first_tensor(output), self._rows)
                return
            for part, value in zip(outputs, (output,) if isinstance(output, Tensor) else output):
                if part:
                    self.recorder.record_rows("block", f"{name}.{part}", value, self._rows)

        return hook


class RuntimeTaps:
    """Our side: the RunObserver an Engine run reports to (runtime.engine.RunObserver).

    `loops`: the loops whose steps are tapped (None: every loop); steps of others (a prefix prefill the
    reference has no step for) record nothing. `latents`: the loop state's attribute holding the latents.
    """

    def __init__(self, recorder: TapRecorder, loops: frozenset[str] | None = None,
                 latents: str | Callable[[Any], Any] = "latents") -> None:
        self.recorder = recorder
        self.loops = loops
        self.latents = latents

    def step_started(self, plan: Any) -> None:
        if self.loops is None or plan.loop in self.loops:
            self.recorder.begin_step(plan.loop, plan.index)

    def step_finished(self, plan: Any, result: Any, state: Any) -> None:
        if not self.recorder.in_step:
            return
        # Every denoise loop's state holds its latents; a loop whose state does not gets no latents tap.
        value = self.latents(state) if callable(self.latents) else getattr(state, self.latents, None)
        self.recorder.record("latents", "latents", value)
        self.recorder.end_step()

    def node_finished(self, node: str, written: Mapping[str, Any]) -> None:
        for slot, value in written.items():
            self.recorder.record("stage", f"{node}.{slot}", value)
