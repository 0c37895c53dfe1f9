"""The denoiser contract: what a family declares so runtime features are written once, against it.

A family's denoise loop hands the runtime a StepPlan whose `inputs[NETWORK]` is its network (a shared
module or a per-request view). What the runtime may do with that step depends on what the network
and the plan declare here, never on which family it is:

- `StagedDenoiser` (the network): its call split into embed -> blocks -> head over a residual stream
  (one tensor, or a tuple for multi-stream models such as LTX-2's video + audio). Step caches
  (runtime.step_cache: DBCache and its first-block case, TeaCache) run the blocks or reuse their residual.
- `CompileUnits` (a resident component): the blocks `torch.compile` wraps, one graph per shape bucket
  (runtime.compile_buckets.compile_denoisers applies it at engine start).
- `DenoiseInputs` (the plan, `StepPlan.denoiser`): which inputs are per-sample (latents, per-sample
  timesteps, conditional and unconditional embeddings: stacked along the batch) and which are
  per-request guidance scales, so cross-request batching (runtime.batching) stacks any family's steps.
- `TeaCacheRescale` (the card, `ModelCard.teacache`): a checkpoint's calibrated TeaCache indicator.
- `GraphInputs` (a per-request plan input: a network view, a text batch): which of its tensors a captured step
  body reads, so CUDA graphs (runtime.cudagraph) copy them into static buffers instead of keeping the first
  request's.
- `PreparesPrompt` (the network): what every step's cross-attention reads from a static prompt (each block's
  keys and values), prepared once per request and CFG branch by the loop (diffusion.prompt_kv) and passed where
  the prompt embeddings went.

Nothing here imports torch modules or a family: a recipe declares, the runtime acts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Hashable, Protocol, Sequence, Union, runtime_checkable

from torch import Tensor, nn

Stream = Union[Tensor, tuple[Tensor, ...]]
"""The residual stream between blocks: [B, S, D] tokens, or one such tensor per modality stream."""


@runtime_checkable
class StagedDenoiser(Protocol):
    """A network whose call is exactly `head(run_blocks(*embed(*args, **kwargs)))`.

    `embed` takes the same arguments as the network's `__call__` (whatever the family's guidance policy
    passes, options such as LTX-2's `isolate` included: they travel in `cond`). Row r of every stream
    tensor is sample r of the call (CFG branches stacked in one call are rows). A network whose
    blocks write state that later steps read (a KV cache of its own tokens that outlives the step)
    must not declare this: skipped blocks would leave that state stale.

    Optional attribute `cache_scope` (hashable): step caches keep separate residuals per scope
    (a causal rollout's chunk: chunk k's residual never stands in for chunk k+1's).
    """

    num_blocks: int

    def embed(self, *args: Any, **kwargs: Any) -> tuple[Stream, Any]:
        """The residual stream for the first block, and the conditioning every block and the head read."""
        ...

    def run_blocks(self, x: Stream, cond: Any, start: int = 0, end: int | None = None) -> Stream:
        """blocks[start:end] over the stream."""
        ...

    def block_input(self, x: Stream, cond: Any, index: int = 0) -> Tensor:
        """The timestep-modulated tokens block `index` feeds to attention (TeaCache's generic indicator);
        rows are samples."""
        ...

    def head(self, x: Stream, cond: Any) -> Any:
        """The stream after the last block -> what the network's call returns."""
        ...


@runtime_checkable
class CompileUnits(Protocol):
    """A resident denoiser module whose blocks `torch.compile` wraps one by one (dynamic=False).

    Units should be structurally identical (a DiT's blocks), so one graph per shape bucket serves all.
    Optional attribute `compile_dynamic` (bool, default False): the units compile with a symbolic token axis
    instead (an AR decoder's steps each pack a different number of tokens; a bucket per count would not bound
    the recompiles). `--fp8` quantizes the same units' linears (runtime.fp8_denoisers).
    """

    def compile_units(self) -> Sequence[nn.Module]:
        ...


@runtime_checkable
class GraphInputs(Protocol):
    """A per-request step input that a captured step body (runtime.cudagraph) may take.

    A network view binding the request's tensors (CLIP tokens, positions, a camera) or a batch of encoded
    prompts is built per request; a graph captured with one request's object would keep reading that
    object's tensors. Declaring this splits it into what fixes the graph and the tensors it reads: the runtime
    rebuilds the object once over static copies of those tensors and refills them before every replay.
    A frozen dataclass needs no declaration: its tensor fields are split out the same way, its plain fields
    (numbers, flags, layouts) fix the graph, and any other field (a shared module) is kept by identity.
    """

    def graph_split(self) -> tuple[Hashable, tuple[Any, ...]]:
        """(fixed, parts): `fixed` is hashable and names everything the captured kernels bake in (the shared
        module's identity, token layout, dtype, flags); `parts` are the tensors (None, or nested GraphInputs)
        the step reads from this object, in a fixed order."""
        ...

    def graph_rebuild(self, parts: tuple[Any, ...]) -> Any:
        """This object over other `parts` (same structure as graph_split's), its fixed part unchanged."""
        ...


@runtime_checkable
class PreparesPrompt(Protocol):
    """A network whose blocks cross-attend to prompt embeddings that do not change between steps.

    `prepare_prompt(embeds)` returns what its call then takes in place of `embeds` (layers.prompt_kv.PromptKV:
    every block's keys and values of those rows), equal to what the call would have projected from `embeds`
    under the adapters active now; None when it cannot now (its weights are sharded away), and the caller passes
    `embeds` itself. The call must accept either, and the result must stack like the embeddings (rows follow
    rows) so guidance policies, cross-request batching and CUDA graphs treat it as they treat a tensor.
    A per-request network view may also declare `prepare_network()`: itself with what its steps read besides the
    prompt prepared the same way (Wan I2V's image keys/values, the same for both CFG branches), or None.
    """

    def prepare_prompt(self, embeds: Tensor) -> Any:
        ...


@dataclass(frozen=True)
class DenoiseInputs:
    """How a denoise step's plan inputs combine across requests (runtime.batching reads it).

    The plan's network must be a shared module (equal by identity) or declare `batch_key()` and
    `stack(views)`; a step with no network input (Cosmos3's prompt prefill) stacks its per-sample inputs alone.
    Every input not named here must be equal (by identity, or by value when hashable)
    across the plans that batch; the plan's call must accept the stacked inputs and return one tensor,
    or a tuple of tensors, whose rows follow the stacked rows.
    """

    per_sample: tuple[str, ...]
    """Inputs stacked along dim 0: latents, per-sample timesteps, conditional/unconditional embeddings.
    A value may be a tensor, None (then None for every plan), or an object with `stack(values)`."""
    scales: tuple[str, ...] = ()
    """Per-request guidance scales: one float when every plan has the same, else a per-sample tensor
    broadcast over the first per_sample input's trailing dimensions."""


GUIDANCE_INPUTS = DenoiseInputs(("latents", "timestep", "prompt_embeds", "negative_embeds"), ("guidance_scale",))
"""The inputs of a diffusion.guidance policy step (Wan, Flux2 use it): latents, timesteps, both embeddings, one scale."""


@dataclass(frozen=True)
class TeaCacheRescale:
    """TeaCache's calibrated indicator for one checkpoint: which tensor it measures, the polynomial that
    maps its raw relative L1 change onto the change of the model output, and the steps that always
    compute (the published `ret_steps` warm-up). Declared on the card (ModelCard.teacache) by the
    family's recipe; the runtime's TeaCache uses it."""

    coefficients: tuple[float, ...]
    """Polynomial coefficients, highest degree first (numpy.poly1d order, as published)."""
    indicator: Callable[[StagedDenoiser, Stream, Any], Tensor]
    """(net, stream, cond) -> the tensor whose consecutive-step change is measured."""
    warmup_steps: int = 0
    """The first steps always compute and leave the accumulator at 0."""

    def __call__(self, distance: float) -> float:
        value = 0.0
        for c in self.coefficients:  # Horner, highest degree first
            value = value * distance + c
        return value


def cache_scope(network: Any) -> Hashable:
    """The network's step-cache scope (StagedDenoiser.cache_scope), None when it declares none."""
    return getattr(network, "cache_scope", None)
