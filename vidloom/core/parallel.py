"""Contracts of multi-device runs: the parallel plan, and the token layout a family declares for it.

Pure data (no torch): the plan is part of DeployConfig, and the layout is read from a
checkpoint's config files in the parent process (Family.token_layout), so a plan that cannot
run fails before any worker process starts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from vidloom.core.errors import DeployError

CFG_DEGREES = (1, 2, 3, 4)


@dataclass(frozen=True)
class ParallelPlan:
    """How one request's work is split over processes; the degrees multiply to the world size.

    Ranks are laid out cfg-major: rank = cfg_rank * sp + sp_rank, so the ranks of one
    sequence-parallel group are adjacent (on one node they share the fastest links).
    """

    sp: int = 1
    """Sequence-parallel degree: each rank holds 1/sp of the tokens; inside self-attention 1/sp of the heads
    (Ulysses), or, where sp does not divide the heads, its queries while keys and values pass around the ranks
    (ring attention). A layout that splits evenly (Wan) needs it to divide every request's token count."""
    cfg: int = 1
    """CFG-parallel degree: 2 runs the conditional branch on cfg-rank 0 and the unconditional one on
    cfg-rank 1 (requests must use guidance, guidance_scale > 1); 1 runs both branches on every rank; 3 or 4 spread
    a family's further guidance passes too (LTX-2's STG and isolated-modality passes: TokenLayout.cfg_passes)."""
    shard_weights: bool = False
    """--shard-weights: each rank of a sequence-parallel group holds 1/sp of every denoiser block's weights and
    gathers a block's whole weights just before it runs (runtime.parallel.shard_weights); needs sp > 1."""
    text_encoder_rank: int | None = None
    """--text-encoder-rank R: only rank R loads the text encoder(s) and encodes each request's prompts, then
    broadcasts the encoded prompt to the other ranks, which never load the encoder's weights
    (runtime.parallel.prompt_rank); None: every rank loads the encoder and encodes the same prompts itself."""

    def __post_init__(self) -> None:
        if not isinstance(self.sp, int) or isinstance(self.sp, bool) or self.sp < 1:
            raise DeployError(f"parallel.sp (--sp) must be an integer >= 1, got {self.sp!r}")
        if self.cfg not in CFG_DEGREES or isinstance(self.cfg, bool):
            raise DeployError(
                f"parallel.cfg must be 1 to 4 (classic CFG has two branches; LTX-2's steps run up to four "
                f"guidance passes), got {self.cfg!r}; --cfg-parallel sets 2, --cfg-parallel N sets N"
            )

        if not isinstance(self.shard_weights, bool):
            raise DeployError(f"parallel.shard_weights (--shard-weights) must be true or false, got "
                              f"{self.shard_weights!r}")
        if self.shard_weights and self.sp < 2:
            raise DeployError("--shard-weights shards the denoiser's blocks over the sequence-parallel group, which "
                              f"needs --sp 2 or more (got sp={self.sp})")
        self._check_text_encoder_rank()

    def _check_text_encoder_rank(self) -> None:
        rank = self.text_encoder_rank
        if rank is None:
            return
        if not isinstance(rank, int) or isinstance(rank, bool) or rank < 0:
            raise DeployError(f"parallel.text_encoder_rank (--text-encoder-rank) must be a rank number >= 0, "
                              f"got {rank!r}")
        if self.world_size < 2:
            raise DeployError("parallel.text_encoder_rank (--text-encoder-rank) puts the text encoder on one rank of "
                              "a parallel plan, but this plan runs one process (sp=1 x cfg=1); add --sp or "
                              "--cfg-parallel, or drop --text-encoder-rank")
        if rank >= self.world_size:
            raise DeployError(f"parallel.text_encoder_rank (--text-encoder-rank) is {rank}, but the plan "
                              f"sp={self.sp} x cfg={self.cfg} has ranks 0 to {self.world_size - 1}")

    @property
    def world_size(self) -> int:
        """Processes (devices) the plan needs."""
        return self.sp * self.cfg

    def describe(self) -> str:
        notes = (["sharded weights"] if self.shard_weights else []) + (
            [f"text encoder on rank {self.text_encoder_rank}"] if self.text_encoder_rank is not None else [])
        return f"sp={self.sp} x cfg={self.cfg}" + (f" ({', '.join(notes)})" if notes else "")


@dataclass(frozen=True)
class SequenceGeometry:
    """What a sequence-parallel plan must divide, read from a checkpoint's config files."""

    num_heads: int
    """Attention heads per layer; Ulysses gives each rank heads/sp of them."""
    patch_size: tuple[int, int, int]
    """DiT patch extent (frames, height, width) in latent units."""
    vae_spatial: int
    """Pixels per latent position along height and width."""
    vae_temporal: int
    """Video frames per latent frame after the first (frames = vae_temporal * k + 1)."""

    def patch_grid(self, height: int, width: int, num_frames: int) -> tuple[int, int, int]:
        """Patches (f, h, w) of one request's latents, as the DiT flattens them into tokens."""
        latent = ((num_frames - 1) // self.vae_temporal + 1, height // self.vae_spatial, width // self.vae_spatial)
        f, h, w = (extent // patch for extent, patch in zip(latent, self.patch_size))
        return f, h, w

    def token_count(self, height: int, width: int, num_frames: int) -> int:
        """Video tokens the DiT attends over for one request: f * h * w patches."""
        return math.prod(self.patch_grid(height, width, num_frames))


SPLITS = ("even", "pad", "rows")


@dataclass(frozen=True)
class TokenLayout:
    """How a family's denoiser lays out its tokens, so the runtime can shard them (Family.token_layout).

    The runtime (runtime.parallel.ulysses.apply_sp) takes each `denoisers` component, swaps its
    `sequence` (vidloom.layers.sequence) for a sharded one and wraps the attention of every layer its
    `self_attentions()` yields in a Ulysses all-to-all; the model shards right after embedding and
    gathers right before its head, and its per-token tables (RoPE, modulation) follow the same rows.
    """

    num_heads: int
    """Attention heads per sharded layer; Ulysses gives each rank heads/sp of them."""
    streams: tuple[str, ...]
    """The token streams the sharded sequence joins, in sequence order: ("video",) for Wan, whose text is
    cross-attention context (whole on every rank); ("text", "image", "reference") for an MMDiT, whose text
    tokens are joined in front of the image tokens and sharded with them."""
    denoisers: tuple[str, ...] = ("transformer",)
    """Instance components whose attention is sharded (each one present in the instance is)."""
    split: str = "even"
    """"even": the sequence must split evenly, checked at submit from `grid` (InvalidRequest naming the size
    field); "pad": a sequence that does not split is padded at its end to a multiple of sp, the pad tokens
    are no keys of any attention (the Ulysses wrapper drops them) and are cut off before the head; "rows":
    each rank keeps a band of patch rows of every frame (SANA-WM), so sp must divide every request's patch rows
    (checked at submit from `grid`, naming `height`) and the self-attention heads (Ulysses only, no ring)."""
    grid: SequenceGeometry | None = None
    """The patch grid that decides the token count at submit (splits "even" and "rows")."""
    cfg_parallel: str | None = None
    """None: classic two-branch CFG whose branches the runtime may run on a rank pair (--cfg-parallel; the
    program takes `guidance=`); else why this checkpoint refuses --cfg-parallel."""
    cfg_passes: int = 2
    """The most guidance passes one step runs, so the largest --cfg-parallel degree that gives every rank work: 2
    for classic CFG (cond, uncond), 4 for LTX-2 (cond, uncond, STG, isolated modality)."""
    prompt_nodes: tuple[str, ...] = ("encode_text",)
    """Program nodes that run the text encoder(s) and nothing else: under --text-encoder-rank only that rank runs
    them and broadcasts the slots they write (runtime.parallel.prompt_rank); () where no node does (a prompt read
    by the backbone itself)."""
    cfg_needs: tuple[str, ...] = field(default=("guidance_scale",))
    """Request fields that must turn CFG on for --cfg-parallel: guidance_scale (> 1), and negative_prompt
    (non-empty) for a family whose CFG runs only with one (Qwen-Image's true CFG)."""

    def __post_init__(self) -> None:
        if self.split not in SPLITS:
            raise ValueError(f"token layout split must be one of {SPLITS}, got {self.split!r}")
        if self.split in ("even", "rows") and self.grid is None:
            raise ValueError(f"a {self.split!r} token layout needs the grid its requests are checked against")
