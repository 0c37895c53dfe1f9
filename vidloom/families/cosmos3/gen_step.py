"""One Cosmos3 denoise step: the per-request network view over its prefilled prefixes, and the guided step body.

A step runs each CFG branch's generated tokens against that branch's prefilled prompt K/V. The view binds a request's
branches and prefixes (nothing per request lands on the shared backbone or generator), so the runtime can stack the
steps of several requests into one forward (runtime.batching): their views must have equal keys, that is the same
prompt token count per branch (equal prefix K/V shapes, and so equal positions for the generated tokens, which start
after the prompt), the same generated-token layout (size, frames, fps, clean frames, sound and action steps) and
dtype. The prefixes are then stacked along a batch axis and every generation layer attends each request's own:
exactly the one-request arithmetic per row, with no padding. Prompts of different token counts do not stack (their
keys differ) and run alone.

Under cuda_graphs (LoopContext.captures_steps) a prompt's prefix K/V instead lives in a buffer padded to its
prompt-length bucket (the next multiple of runtime.prompt_buckets.PROMPT_BUCKET tokens), so one captured step serves
every prompt length of the bucket: the padding keys are masked out (`prefix_mask`, one boolean SDPA key mask broadcast over every query row:
their attention weights are exactly zero) and the generated tokens' rotary positions, which follow the real length,
are a tensor input refilled at each replay (GenLayout.on), not part of the graph's shape. The reference (diffusers'
Cosmos3OmniPipeline) pads nothing: it runs one unpadded prompt per branch, as the eager path does; the padded step
computes the same attention over the same prompt keys, the masked SDPA call only summing in another order (float32:
velocities within 2e-6 of eager on the demo checkpoint, tests/integration/test_cosmos3_cuda_graphs.py). The padded
buffer is the request's cache allocation itself, a static buffer (runtime.static_buffers: charged to the cache budget
and the request ledger, handed to the next request of its bucket, which then replays the graphs recorded over it),
one pool per CFG branch so each request's branches take the buffers those graphs read. A graphed request's steps run
alone (batch_key None): a stacked copy of several prefixes would be a static input of its own, outside that
accounting.

A batched step reads a stacked copy of its requests' prefixes (B times one request's prefix K/V per CFG branch, freed
after the step); each request's own buffers stay in the cache manager, unchanged. The copy is not in any request's
estimate: the view declares its bytes (`stacked_bytes`) and the device worker reserves them on the memory ledger for
the step, cutting the batch short where they do not fit (runtime.worker_rounds).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Hashable

import torch
from torch import Tensor

from vidloom.core.denoiser import DenoiseInputs
from vidloom.diffusion.guidance import BranchExchange
from vidloom.families.cosmos3.generation import ActionTokens, Cosmos3Generator, GenConditioning, prefixed_attention
from vidloom.families.cosmos3.layout import GenLayout, text_prefix_positions
from vidloom.families.cosmos3.transformer import Cosmos3Transformer
from vidloom.layers.sequence import WHOLE_SEQUENCE


class PaddedPrefix:
    """One CFG branch's prefix K/V buffer [layers, 2, bucket, kv_heads, head_dim] under cuda_graphs, a static buffer
    (runtime.static_buffers) that passes to the next request of its bucket. Compared and hashed by identity: a
    captured step's signature holds it (Cosmos3View.graph_split), so the graphs recorded over it replay for every
    request that takes it and go when it is dropped."""

    def __init__(self, kv: Tensor) -> None:
        self.kv = kv

    @property
    def nbytes(self) -> int:
        return self.kv.nbytes

STEP_INPUTS = DenoiseInputs(("latents", "timestep", "sound", "action"), ("guidance_scale",))
"""Per request in a batched step: latents [B, C, T, h, w], timesteps [B], sound [B, C_s, T_s], action streams; the
guidance scale per request. The view (NETWORK) stacks the prefixes; `branches` (the CFG branch count), `action_width`
and `cfg_pair` must be equal."""

Velocities = tuple[Tensor, Tensor | None, Tensor | None]


@dataclass(frozen=True)
class Branch:
    """One CFG branch: its prompt ids and the layout of its generated tokens (positions follow the prompt)."""

    ids: Tensor  # [L] long
    layout: GenLayout
    key: tuple[Any, ...] = ()  # (L, layout.batch_key()): computed once per request (Branch.of)

    @classmethod
    def of(cls, ids: Tensor, layout: GenLayout) -> Branch:
        return cls(ids, layout, (len(ids), layout.batch_key()))


PREFILL_INPUTS = DenoiseInputs(("ids", "out"))
"""A prefix prefill's per-request inputs: prompt ids [B, L] and the K/V buffers [B, layers, 2, L, kv_heads, head_dim]
they fill. Prompts of one length stack (their positions are alike); the backbone and generator are shared inputs."""


def prefill_step(generator: Cosmos3Generator, backbone: Cosmos3Transformer, ids: Tensor, out: Tensor) -> Tensor:
    """Prefill a batch of prompts of one length: ids [B, L] -> their per-layer K/V written into `out`; returns it
    (a batched plan's `out` is a stacked copy: the loop copies each request's rows back into its own buffer)."""
    positions = text_prefix_positions(ids.shape[-1], generator.config)
    return generator.prefill(backbone, ids, positions, out)


@dataclass(frozen=True)
class Cosmos3View:
    """The network a denoise step calls once per CFG branch: (branch, latents, timestep, sound, action) ->
    (vision, sound, action) velocities with a leading batch axis, over one request's prefixes (or a batch's).

    `prefixes`: per branch [B, layers, 2, L, kv_heads, head_dim], a view of the request's cache-manager buffer (B = 1)
    or the stacked prefixes of a batch; None: the prefixes are recomputed every step (cache_prefix=False), and such a
    request runs alone. Under cuda_graphs `slabs` are the request's bucket-padded buffers (the prefixes view them, L
    the bucket length) and `prefix_masks` [L] bool per branch mark the prompt's rows (the module docstring).
    """

    generator: Cosmos3Generator
    backbone: Cosmos3Transformer
    branches: tuple[Branch, ...]
    prefixes: tuple[Tensor, ...] | None
    prefix_masks: tuple[Tensor, ...] | None = None
    slabs: tuple[PaddedPrefix, ...] | None = None

    def batch_key(self) -> tuple[Any, ...] | None:
        """Equal for requests whose steps stack (see the module docstring); None: this one runs alone (prefixes
        recomputed per step, a sharded stream, whose attention takes one request's rows, or a graphed step, which
        reads its own static prefix buffers)."""
        g = self.generator
        if (self.slabs is not None or self.prefixes is None or g.sequence is not WHOLE_SEQUENCE
                or g.joint.attention_fn is not prefixed_attention):
            return None
        p = self.prefixes[0]
        return (id(g), id(self.backbone), tuple(b.key for b in self.branches), p.dtype, p.device)

    @property
    def stacked_bytes(self) -> int:
        """What this request adds to a batched step's stacked copy (runtime.batching.stacked_bytes): its prefixes, one
        per CFG branch, which `stack` concatenates; the device worker reserves it on the memory ledger for the step."""
        return sum(p.numel() * p.element_size() for p in self.prefixes or ())

    @staticmethod
    def stack(views: list[Cosmos3View]) -> Cosmos3View:
        first = views[0]
        prefixes = tuple(torch.cat([v.prefixes[k] for v in views]) for k in range(len(first.branches)))  # type: ignore[index]
        return dataclasses.replace(first, prefixes=prefixes)

    def graph_split(self) -> tuple[Hashable, tuple[Any, ...]]:
        """core.denoiser.GraphInputs: a captured step bakes in the modules, each branch's generated-token layout (grid,
        noisy frames, sound and action steps) and its padded prefix buffer (by identity, read in place: never copied
        into a static input); it reads each branch's positions, noisy-frame index and prefix mask as tensors, so every
        prompt length of the buckets replays it. A view without slabs (prefixes recomputed per step) bakes in its
        prompts' ids and layouts whole (a CUDA capture then fails on the prefill's host-built prefix positions, and
        that signature runs eagerly)."""
        if self.slabs is None:  # the ids, and the positions by value (Branch.key): they follow the prompt and the fps
            return (self.generator, self.backbone, tuple((tuple(b.ids.tolist()), b.key) for b in self.branches)), ()
        layouts = tuple((b.layout.latent_shape, b.layout.patch, b.layout.noisy_frames, b.layout.sound_len,
                         b.layout.action_len, b.layout.action_noisy) for b in self.branches)
        masks = self.prefix_masks or ()
        parts = tuple((b.layout.positions, b.layout.noisy_index, m) for b, m in zip(self.branches, masks, strict=True))
        return (self.generator, self.backbone, self.slabs, layouts), parts

    def graph_rebuild(self, parts: tuple[Any, ...]) -> Cosmos3View:
        if self.slabs is None:
            return self
        branches = tuple(dataclasses.replace(b, layout=dataclasses.replace(b.layout, positions=p, noisy_index=n))
                         for b, (p, n, _) in zip(self.branches, parts, strict=True))
        return dataclasses.replace(self, branches=branches, prefix_masks=tuple(m for _, _, m in parts))

    def __call__(self, branch: int, latents: Tensor, timestep: Tensor, sound: Tensor | None,
                 action: ActionTokens | None = None) -> Velocities:
        x, cond = self.embed(branch, latents, timestep, sound, action)
        return self.head(self.run_blocks(x, cond), cond)

    # The staged denoiser contract (core.denoiser.StagedDenoiser); __call__ is their composition. The action
    # tokens are part of the residual stream (after vision and sound), so a step cache reuses them too.

    @property
    def num_blocks(self) -> int:
        return self.generator.num_blocks

    def embed(self, branch: int, latents: Tensor, timestep: Tensor, sound: Tensor | None,
              action: ActionTokens | None = None) -> tuple[Tensor, GenConditioning]:
        mask = None if self.prefix_masks is None else self.prefix_masks[branch]
        return self.generator.embed(self.backbone, self._prefix(branch, latents), self.branches[branch].layout,
                                    latents, timestep, sound, action, mask)

    def run_blocks(self, x: Tensor, cond: GenConditioning, start: int = 0, end: int | None = None) -> Tensor:
        return self.generator.run_blocks(x, cond, start, end)

    def block_input(self, x: Tensor, cond: GenConditioning, index: int = 0) -> Tensor:
        return self.generator.block_input(x, cond, index)

    def head(self, x: Tensor, cond: GenConditioning) -> Velocities:
        return self.generator.head(x, cond)

    def _prefix(self, k: int, latents: Tensor) -> Tensor:
        if self.prefixes is not None:
            return self.prefixes[k]
        branch = self.branches[k]  # recompute: the prefix again, this step (one request: its key is None)
        return prefill_step(self.generator, self.backbone, branch.ids[None],
                            latents.new_empty(1, *self.generator.prefix_shape(len(branch.ids))))


def denoise_step(network: Cosmos3View, branches: int, latents: Tensor, sound: Tensor | None, timestep: Tensor,
                 guidance_scale: float | Tensor, action: ActionTokens | None = None, action_width: int = 0,
                 cfg_pair: BranchExchange | None = None) -> Velocities:
    """Guided velocities (vision [B, C, T, h, w], sound [B, C_s, T_s], action [B, T_a, D]; None where absent) in
    float32, as the reference combines them; action channels past `action_width` (the embodiment's) are zero.

    `network` runs the generated tokens of each of the `branches` CFG branches (a step cache may stand in for it,
    which is why their count is an input of its own); `guidance_scale`: one float, or one per
    request ([B, 1, 1, 1, 1], a batch of requests that guide differently). `cfg_pair`: a --cfg-parallel pair; this
    rank runs branch `cfg_pair.rank` only and the pair gathers both predictions."""
    outs = []
    mine = range(branches) if cfg_pair is None else (cfg_pair.rank,)
    for k in mine:
        vision, audio, acts = network(k, latents, timestep, sound, action)
        if acts is not None:
            acts = acts.float()
            acts[..., action_width:] = 0
        outs.append(tuple(None if v is None else v.float() for v in (vision, audio, acts)))
    if cfg_pair is not None:  # both ranks hold (cond, uncond) of every output after the exchange
        gathered = [None if v is None else cfg_pair.all_gather(v) for v in outs[0]]  # [2, ...] each
        outs = [tuple(None if g is None else g[k] for g in gathered) for k in range(cfg_pair.size)]
    cond, *rest = outs
    if not rest:
        return cond  # type: ignore[return-value]
    return tuple(None if c is None else u + _per_row(guidance_scale, c) * (c - u)  # type: ignore[return-value]
                 for c, u in zip(cond, rest[0]))


def _per_row(scale: float | Tensor, like: Tensor) -> float | Tensor:
    """A float as is (the one-request arithmetic); a per-request scale shaped to broadcast over `like`'s rows."""
    return scale if not isinstance(scale, Tensor) else scale.reshape(-1, *([1] * (like.dim() - 1)))
