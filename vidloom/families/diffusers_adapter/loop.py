"""A diffusers pipeline call as one runtime loop: the call runs on a thread the loop owns and pauses at each step.

The pipeline's step hook (`callback_on_step_end`, or the older `callback`) hands control back: the pipeline
thread blocks there until the runtime executes the loop's next plan. Exactly one of the two threads runs at a
time, so the runtime sees every step boundary (progress, cancellation, interleaving with other requests) and the
pipeline's own code runs unchanged. Cancellation sets the pipeline's `_interrupt` flag and stops the call at the
step it is paused on (raising out of the hook), so nothing is decoded for a cancelled request. A pipeline without a
step hook (signature.NO_HOOK) is one opaque step: the whole call runs inside it.

Whatever the pipeline raises reaches the request as our own error: a ValueError before its first step is its input
check refusing the request (InvalidRequest, naming our field where the message names its keyword); anything else is
a PipelineFailed naming the class and the step, with the traceback in the log.
"""

from __future__ import annotations

import copy
import logging
import queue
import re
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from vidloom.core.errors import InvalidRequest, VidloomError, counted
from vidloom.core.loop import DONE, Done, LoopContext, StepPlan
from vidloom.core.request import GenerationRequest
from vidloom.families.diffusers_adapter.signature import NO_HOOK

LOOP_NAME = "pipeline"
log = logging.getLogger(__name__)


class PipelineFailed(VidloomError):
    """An adapted pipeline raised while it ran (a bug or limit of the pipeline, not of the request)."""


class _Stopped(Exception):
    """Raised inside the pipeline's step hook to end a call the runtime abandoned (cancel, failure)."""


@dataclass
class PipelineCall:
    """One request's pipeline call, on its own thread; the handshake that steps it.

    `resume` runs on the runtime's thread: it lets the pipeline thread go on and waits until it pauses at its
    next step hook (returns ("step", index)), finishes (("done", output)) or raises (("error", exc)).
    """

    pipe: Any  # this request's view of the pipeline (see request_view)
    kwargs: dict[str, Any]
    hook: str
    total: int
    steps: int = 0
    output: Any = None
    finished: bool = False
    # The handshake: the runtime releases `_go` to let the paused pipeline thread run on; the thread answers on
    # `_events` each time it pauses, ends or fails.
    _go: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0), init=False, repr=False)
    _events: queue.Queue = field(default_factory=queue.Queue, init=False, repr=False)
    _thread: threading.Thread | None = field(default=None, init=False, repr=False)
    _stop: bool = field(default=False, init=False, repr=False)

    def resume(self) -> tuple[str, Any]:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="vidloom-diffusers-pipeline", daemon=True)
            self._thread.start()
        else:
            self._go.release()
        return self._events.get()

    def stop(self) -> None:
        """End the call wherever it is paused and wait for its thread (the loop's release path)."""
        if self._thread is None or not self._thread.is_alive():
            return
        self._stop = True
        self._go.release()
        self._thread.join()

    def _pause(self, index: int) -> None:
        self._events.put(("step", index))
        self._go.acquire()
        if self._stop:
            self.pipe._interrupt = True  # the pipeline's own cancel flag, for code that reads it after the hook
            raise _Stopped

    def _on_step_end(self, pipe: Any, index: int, timestep: Any, tensors: dict[str, Any]) -> dict[str, Any]:
        self._pause(index)
        return tensors

    def _on_callback(self, index: int, timestep: Any, latents: Any) -> None:
        self._pause(index)

    def _run(self) -> None:
        hooks: dict[str, Any] = (
            {"callback_on_step_end": self._on_step_end} if self.hook == "callback_on_step_end"
            else {} if self.hook == NO_HOOK else {"callback": self._on_callback, "callback_steps": 1}
        )
        try:
            result = self.pipe(**self.kwargs, **hooks)
        except _Stopped:
            return
        except BaseException as exc:  # handed to the runtime's thread, which raises it in the request
            self._events.put(("error", exc))
            return
        self._events.put(("done", result))


def request_view(pipe: Any) -> Any:
    """A per-request pipeline sharing `pipe`'s modules (one copy of the weights) but not its call state.

    Diffusers pipelines keep per-call state on themselves (`_guidance_scale`, `_interrupt`, `_num_timesteps`)
    and on their scheduler (timesteps, step index, solver history); two interleaved requests on one object would
    overwrite each other's, so each request steps a shallow copy with its own scheduler."""
    view = copy.copy(pipe)
    view.__dict__["scheduler"] = copy.deepcopy(pipe.scheduler)
    return view


class PipelineLoop:
    """The Loop protocol over a PipelineCall: one plan per pipeline step; finalize runs what follows the last
    step (the VAE decode, the vocoder) and returns the pipeline's output."""

    name = LOOP_NAME

    def __init__(self, pipe: Any, hook: str, kwargs_for: Callable[[GenerationRequest], dict[str, Any]],
                 encoded: Callable[[], None] | None = None, fields: dict[str, str] | None = None) -> None:
        """`encoded`: run once a request's text encoding is over (at its first step boundary), e.g. to send
        offloaded text encoders back to host memory. `fields`: the pipeline's keyword -> our request field, to
        name the field when the pipeline refuses its inputs."""
        self._pipe = pipe
        self._hook = hook
        self._kwargs_for = kwargs_for
        self._encoded = encoded
        self._fields = fields or {}

    def init(self, slots: Mapping[str, Any], ctx: LoopContext) -> PipelineCall:
        request: GenerationRequest = slots["request"]
        steps = 1 if self._hook == NO_HOOK else int(request.num_inference_steps)
        call = PipelineCall(pipe=request_view(self._pipe), kwargs=self._kwargs_for(request), hook=self._hook,
                            total=steps)
        ctx.hold(call.stop)
        return call

    def next(self, state: PipelineCall) -> StepPlan | Done:
        if state.finished or state.steps >= state.total:
            return DONE
        return StepPlan(loop=self.name, index=state.steps, total=state.total, call=state.resume)

    def advance(self, state: PipelineCall, result: tuple[str, Any]) -> PipelineCall:
        kind, value = result
        if kind == "error":
            raise self._error(value, state)
        if kind == "done":
            state.output, state.finished = value, True
            return state
        state.steps += 1
        if state.steps == 1 and self._encoded is not None:  # the pipeline thread is paused: nothing else runs
            self._encoded()
        # The pipeline may run more or fewer steps than asked (a schedule that drops or repeats timesteps);
        # its own count, once it has one, is the total the runtime reports.
        counted = getattr(state.pipe, "_num_timesteps", None)
        if isinstance(counted, int) and counted >= state.steps:
            state.total = counted
        return state

    def finalize(self, state: PipelineCall) -> dict[str, Any]:
        while not state.finished:  # after the last step: decode (no more step hooks, or steps past the total)
            kind, value = state.resume()
            if kind == "error":
                raise self._error(value, state)
            if kind == "done":
                state.output, state.finished = value, True
        return {"pipeline_output": state.output}

    def _error(self, exc: BaseException, state: PipelineCall) -> BaseException:
        """`exc` from the pipeline thread as the request's error (see the module docstring)."""
        if isinstance(exc, VidloomError) or not isinstance(exc, Exception):
            return exc
        name = type(state.pipe).__name__
        if isinstance(exc, ValueError) and state.steps == 0 and self._hook != NO_HOOK:
            return refusal(name, exc, self._fields)
        log.warning("%s failed after %d completed steps", name, state.steps, exc_info=exc)
        return PipelineFailed(f"{name} failed after {counted(state.steps, 'completed step')}: "
                              f"{type(exc).__name__}: {exc}")


def refusal(pipeline: str, exc: Exception, fields: dict[str, str]) -> InvalidRequest:
    """The pipeline's own input check refusing a request, under the field its message names first (its keyword
    mapped to ours), else under "request"."""
    message = str(exc)
    named = [(m.start(), fields.get(word, word)) for word in {*fields, *fields.values()}
             if (m := re.search(rf"\b{re.escape(word)}\b", message))]
    field = min(named)[1] if named else "request"
    return InvalidRequest(field, f"{pipeline} refused it: {message}")
