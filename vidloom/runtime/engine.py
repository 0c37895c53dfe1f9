"""Sync Engine: runs one request's program to completion in the caller's thread."""

from __future__ import annotations

import gc
import threading
import time
from typing import Any, Mapping

import torch

from vidloom.core.errors import Cancelled
from vidloom.core.instance import ModelInstance
from vidloom.core.loop import StepPlan, run_loop
from vidloom.core.output import EventCallback, ProgressEvent
from vidloom.core.program import Node, Program
from vidloom.core.request import GenerationRequest, resolve_request


class CancellationToken:
    """Set from any thread; the engine honours it at the next step boundary."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def cancel(self) -> None:
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()


class _RunContext:
    """Per-run runtime services handed to nodes and loops (never shared between runs)."""

    def __init__(self, request_id: str, on_event: EventCallback | None, cancel: CancellationToken | None):
        self.request_id = request_id
        self._on_event = on_event
        self._cancel = cancel

    def check_cancelled(self) -> None:
        if self._cancel is not None and self._cancel.cancelled:
            raise Cancelled(f"request {self.request_id} was cancelled")

    def execute(self, plan: StepPlan) -> Any:
        self.check_cancelled()
        result = plan.call(**plan.inputs)
        self.progress(plan.loop, plan.index + 1, plan.total)
        return result

    def progress(self, phase: str, done: int, total: int) -> None:
        if self._on_event is not None:
            self._on_event(ProgressEvent(self.request_id, phase, done, total))
        self.check_cancelled()


class Engine:
    """Runs programs over one loaded ModelInstance."""

    def __init__(self, instance: ModelInstance, program: Program) -> None:
        self.instance = instance
        self.program = program

    def run(
        self,
        request: GenerationRequest,
        on_event: EventCallback | None = None,
        cancel: CancellationToken | None = None,
    ) -> dict[str, Any]:
        """Validate `request`, run every active node, return the program's output slots.

        Raises InvalidRequest before any work, Cancelled at a step boundary.
        """
        request = resolve_request(request, self.instance.card)
        ctx = _RunContext(request.request_id, on_event, cancel)
        slots: dict[str, Any] = {"request": request}
        started = time.perf_counter()
        try:
            with torch.inference_mode():
                for node in self.program.active_nodes(request):
                    ctx.check_cancelled()
                    slots.update(self._run_node(node, slots, ctx))
            outputs = {name: slots[name] for name in self.program.outputs}
            outputs["request"] = request
            outputs["elapsed_s"] = time.perf_counter() - started
            return outputs
        finally:
            # Drop every intermediate (latents, embeddings) now, also on failure/cancel.
            slots.clear()
            _release_device_memory(self.instance.device)

    @staticmethod
    def _run_node(node: Node, slots: Mapping[str, Any], ctx: _RunContext) -> Mapping[str, Any]:
        reads = {name: slots[name] for name in node.reads}
        if node.loop is not None:
            written = run_loop(node.loop, reads, ctx)
        else:
            assert node.run is not None
            written = node.run(reads, ctx)
        missing = [name for name in node.writes if name not in written]
        assert not missing, f"node {node.name!r} did not write {missing}"
        return written


def _release_device_memory(device: torch.device) -> None:
    if device.type == "cuda":
        gc.collect()
        torch.cuda.empty_cache()
