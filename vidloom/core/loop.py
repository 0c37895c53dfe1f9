"""The Loop protocol: the model owns the loop, the runtime drives it one step at a time.

    state = loop.init(slots, ctx)
    while not isinstance(plan := loop.next(state), Done):
        state = loop.advance(state, runtime.execute(plan))
    outputs = loop.finalize(state)

The runtime's driver is vidloom.runtime.request_run.RequestRun.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Hashable, Mapping, Protocol, TypeVar

from vidloom.core.denoiser import DenoiseInputs
from vidloom.core.output import VideoChunk

S = TypeVar("S")
T = TypeVar("T")


@dataclass(frozen=True)
class Done:
    """Returned by `Loop.next` when the loop has no more steps."""


DONE = Done()


@dataclass(frozen=True)
class StepPlan:
    """One step a loop asks the runtime to run: `call(**inputs)`.

    The loop builds it without running kernels; the runtime executes it, so it can
    observe, intercept (step caches), capture (CUDA graphs) or interleave it.

    `inputs[NETWORK]`, when present, is the network `call` runs (the denoiser), called
    once per CFG branch or once for a stacked batch; interceptors may replace it with a
    view that runs it differently (a step cache skipping blocks) without the loop knowing.
    """

    loop: str  # name of the loop that planned it
    index: int  # 0-based step index
    total: int | None  # steps the loop will run; None: open-ended (AR decode stops on EOS / stop / budget)
    call: Callable[..., Any]
    inputs: Mapping[str, Any] = field(default_factory=dict)
    expert: str | None = None  # which of a model's networks runs this step, when it has several (Wan2.2 A14B)
    # A denoise step's declaration of its inputs (per sample / guidance scales / shared), which lets the
    # runtime stack it with other requests' steps (runtime.batching); None: the step always runs alone.
    denoiser: DenoiseInputs | None = None
    # A step that is not a denoise step and runs alone by nature (a causal rollout's KV prefill, a chunk's decode):
    # under the batch policy it runs alone without turning batching off for the request, whose denoise steps stack.
    runs_alone: bool = False


NETWORK = "network"
"""The StepPlan input key that holds the step's network (see StepPlan)."""

KV_SEQUENCE = "seq"
"""The StepPlan input key naming the paged KV sequence (LoopContext.reserve_kv) a decode step extends.

Such a plan is `network(tokens, positions, kv=..., logits_at=...)` over `inputs["tokens"]` new tokens
after `inputs["start"]` cached ones (or `network(None, ..., inputs_embeds=...)` over `inputs["embeds"]` rows,
for a network fed embeddings, such as a talker); the runtime supplies `kv` and returns the last token's logits."""


def is_decode_step(plan: StepPlan | None) -> bool:
    """Whether `plan` is a paged decode step (see KV_SEQUENCE), which the runtime batches across requests."""
    return plan is not None and KV_SEQUENCE in plan.inputs


class StepInterceptor(Protocol):
    """Runs one request's loop steps in place of `plan.call(**plan.inputs)`; owns that request's state.

    Built per request by the runtime and dropped with it, so state never lands on
    shared modules and concurrent requests never see each other's.
    """

    def execute(self, plan: StepPlan) -> Any:
        """Run `plan`, returning what `plan.call` would have returned (or a stand-in for it)."""
        ...

    def report(self) -> dict[str, Any]:
        """Metadata entries for the finished run (e.g. {"step_cache": {...}})."""
        ...

    def close(self) -> None:
        """Release held tensors; `report` keeps working."""
        ...


class LoopContext(Protocol):
    """What the runtime offers a loop at `init`; the loop owns semantics, the runtime lifetimes."""

    def progress(self, phase: str, done: int, total: int) -> None:
        """Report progress of a phase other than the plan's own steps (e.g. chunks of a rollout)."""
        ...

    def hold(self, release: Callable[[], None]) -> None:
        """Run `release` once the loop ends, whether it finished, failed or was cancelled."""
        ...

    def emit(self, chunk: VideoChunk) -> None:
        """Hand a finished piece of the output to the caller now (it reaches them as a ChunkEvent)."""
        ...

    def emit_audio(self, index: int, start_sample: int, audio: Any, sample_rate: int) -> None:
        """Hand finished speech samples to the caller now (they reach them as an AudioChunkEvent)."""
        ...

    def emit_text(self, phase: str, text: str, token_ids: tuple[int, ...] = ()) -> None:
        """Hand decoded text (and the token ids it came from) to the caller now (it reaches them as a TextEvent)."""
        ...

    def reserve_kv(self, tokens: int, network: Any = None) -> str:
        """Reserve paged KV for one sequence of up to `tokens` tokens; returns its sequence id.

        The blocks come from the runtime's paged pool for `network` (None: the chat loop's; another must be
        one of the program's `paged_networks`), CacheBudgetExceeded, before any work, when it cannot hold
        them, and return to it when the loop ends. A plan that names the id in `inputs[KV_SEQUENCE]` is a
        paged decode step: the runtime runs it in one forward with the decode steps of every other running
        sequence of the same network (chats, a reasoner's, other requests' talkers), whichever request owns them.
        """
        ...

    @property
    def captures_steps(self) -> bool:
        """Whether this run's steps may replay CUDA graphs (cuda_graphs on): a loop that lays its step inputs out so
        that requests share graphs (Cosmos3's prompt-length buckets) asks before building them."""
        ...

    def allocate(self, nbytes: int, build: Callable[[], T], reuse: Hashable | None = None) -> T:
        """A long-lived buffer (a KV slab of `nbytes`) from the runtime's cache manager.

        Accounted against the deployment's cache budget (CacheBudgetExceeded when it does
        not fit, before `build` runs) and released when the loop ends.
        `reuse`: the buffer is one that captured steps write in place (a key naming its shape); under CUDA graphs
        it may be a buffer an earlier request of that key held, in whatever state it left it (runtime.static_buffers).
        """
        ...


class SessionContext(LoopContext, Protocol):
    """What a causal loop also gets: state that outlives the request (continuation sessions)."""

    @property
    def keeps_sessions(self) -> bool:
        """Whether the deployment keeps a finished request's KV resident (worth preparing it)."""
        ...

    def keep_session(self, nbytes: int, build: Callable[[], Any]) -> bool:
        """Keep `build()` as this request's session (id: its request id); False when it is not kept."""
        ...

    def session(self, session_id: str) -> Any | None:
        """A resident session's buffer (held until the loop ends), or None: rebuild it."""
        ...


class Loop(Protocol, Generic[S]):
    """Iterative work owned by a model. Per-request state lives in `S`, never on modules."""

    name: str

    def init(self, slots: Mapping[str, Any], ctx: LoopContext) -> S:
        """Build fresh per-request state from the program's slots; long-lived buffers go through `ctx.hold`."""
        ...

    def next(self, state: S) -> StepPlan | Done:
        """Plan the next step (no kernels run here), or Done."""
        ...

    def advance(self, state: S, result: Any) -> S:
        """Fold the result of an executed plan into the state."""
        ...

    def finalize(self, state: S) -> dict[str, Any]:
        """Slot values the loop writes when it is done."""
        ...

