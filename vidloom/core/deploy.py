"""DeployConfig: how a model is deployed on its device(s), fixed when it is loaded."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePath

from vidloom.core.errors import DeployError
from vidloom.core.parallel import ParallelPlan

COMPILE_BACKENDS = ("inductor", "aot_eager", "eager")
MAX_TAYLORSEER_ORDER = 2  # runtime.taylorseer: orders 1 and 2 are the ones TaylorSeer and cache-dit recommend
MAX_STEP_CACHE_STEPS = 10_000  # DBCache step counts and mask lengths (far above any sampler's steps)
# Single-file formats a component override may be (docs/loading-checkpoints.md).
COMPONENT_FILE_SUFFIXES = (".safetensors", ".gguf")


@dataclass(frozen=True)
class DeployConfig:
    """Load-time performance and memory options; defaults are the plain reference path.

    One field per feature, each read by the loader, the program builder or the runtime.
    """

    fp8_weights: bool = False
    """Store the denoiser's block linears in float8_e4m3fn with per-channel scales."""
    compile: bool = False
    """torch.compile each of the denoiser's compile units (Wan: every DiT block)."""
    compile_backend: str = "inductor"
    """torch.compile backend; "aot_eager"/"eager" trace without generating kernels (tests)."""
    warmup_shapes: tuple[tuple[int, int, int], ...] = ()
    """(height, width, num_frames) buckets run once at load so requests skip compilation."""
    offload_text_encoder: bool = False
    """Keep the text encoder in CPU memory and move it to the device only while encoding."""
    prompt_cache_size: int = 0
    """How many recent prompt embeddings to keep; repeated prompts skip the encoder."""
    vae_tile: int | None = None
    """Decode in tiles of this many pixels (audio VAEs: waveform samples; None: whole) to bound peak memory."""
    vae_tile_stride: int | None = None
    """Pixels (audio: samples) between tile starts (default: 3/4 of vae_tile); the overlap is blended (audio: cut)."""
    attention_backend: str = "sdpa"
    """Attention kernel: "sdpa" (PyTorch), "math" (SDPA held to its math kernel), "flash" (flash-attn) or "sage"
    (SageAttention); checked at load (models that mask every call take sdpa or math only)."""
    cfg_mode: str = "sequential"
    """How CFG runs its two branches: "sequential" (two forwards, the reference) or "batched" (one forward of batch 2)."""
    step_cache: str = "none"
    """Step cache policy: "none", "teacache", "fbcache" (first-block cache), "dbcache" (cache-dit's DBCache) or a
    DBCache preset "fast" | "balanced" | "quality"; skips DiT blocks on steps that barely change."""
    step_cache_threshold: float | None = None
    """Default step-cache threshold (None: the policy's own); requests may override it. 0 never skips."""
    step_cache_fn: int | None = None
    """DBCache: front blocks computed every step (--step-cache-fn; None: the policy's own)."""
    step_cache_bn: int | None = None
    """DBCache: back blocks computed every step (--step-cache-bn)."""
    step_cache_warmup: int | None = None
    """DBCache: steps each CFG branch always computes first (--step-cache-warmup)."""
    step_cache_max_cached: int | None = None
    """DBCache: most steps a branch may cache (--step-cache-max-cached; -1: no limit)."""
    step_cache_max_continuous: int | None = None
    """DBCache: most steps a branch may cache in a row (--step-cache-max-continuous; -1: no limit)."""
    step_cache_taylorseer: int | None = None
    """DBCache: TaylorSeer order forecasting the reused residual, 0 (reuse as is), 1 or 2 (--step-cache-taylorseer)."""
    step_cache_mask: str | None = None
    """DBCache: steps forced to compute (1) or allowed to cache (0), "[static:|dynamic:]1111011..." (--step-cache-mask);
    static caches every 0 step unmeasured, dynamic (the default) lets the threshold decide."""
    cuda_graphs: bool = False
    """Capture each loop step body as a CUDA graph and replay it (CUDA only; steps a step cache
    intercepts run eagerly, since the cache changes which kernels run)."""
    kv_cache_budget_bytes: int | None = None
    """Bytes of KV cache (causal-video slabs) all running requests may hold together; None: no limit.
    A request whose cache would not fit fails with CacheBudgetExceeded before its first step."""
    kv_pool_tokens: int | None = None
    """Tokens of KV the paged pool for chat (AR decode) holds across all running sequences (--kv-pool-tokens);
    None: 16384. Allocated once at load, inside kv_cache_budget_bytes; a chat request whose prompt + max_tokens
    do not fit in what is free is refused with CacheBudgetExceeded. Refused at load by models without chat."""
    kv_session_ttl_s: float = 0.0
    """Seconds a finished causal video's KV stays resident for an extension (extend_from) while unused;
    0 keeps none. Sessions count against kv_cache_budget_bytes and are evicted least recently used when
    a new allocation needs room; an extension whose session is gone rebuilds it from the stored latents."""
    offload_idle_expert: bool = False
    """Two-expert checkpoints (Wan2.2 A14B): keep only the running expert on the device, the idle one in
    host memory (one expert's weights of device memory instead of two, an upload per expert switch)."""
    two_stage: bool = False
    """Multi-stage models (LTX-2): generate, upsample the latents 2x, refine (--two-stage); the upsampler comes
    from `upsampler` or the checkpoint's own latent_upsampler/ folder."""
    upsampler: str | None = None
    """A latent upsampler folder (LTX2LatentUpsamplerModel, or an LTX2LatentUpsamplePipeline folder); implies two_stage."""
    stage2_lora: str | None = None
    """A LoRA file applied in the second stage only (--stage2-lora PATH[:SCALE], scale 1.0 by default), on top of
    a request's own adapters: LTX-2's distilled refinement LoRA. Needs two_stage (or upsampler)."""
    components: tuple[tuple[str, str], ...] = ()
    """(component, file) overrides (--component NAME=FILE; `components:` in a card): the component's weights come
    from one .safetensors (diffusers, original or ComfyUI layout, FP8 with scales) or .gguf file instead of the
    checkpoint folder, which still gives every config and every other component (docs/loading-checkpoints.md)."""
    devices: int = 1
    """Processes, one per device (--devices); more than 1 runs a worker pool split by `parallel`."""
    parallel: ParallelPlan = ParallelPlan()
    """How requests are split over the `devices` processes (--sp, --cfg-parallel); degrees multiply to `devices`."""

    def __post_init__(self) -> None:
        if self.compile_backend not in COMPILE_BACKENDS:
            raise DeployError(f"compile_backend {self.compile_backend!r} unknown; known: {', '.join(COMPILE_BACKENDS)}")
        if self.prompt_cache_size < 0:
            raise DeployError(f"prompt_cache_size must be >= 0, got {self.prompt_cache_size}")
        for shape in self.warmup_shapes:
            if len(shape) != 3 or min(shape) < 1:
                raise DeployError(f"warmup_shapes entries are (height, width, num_frames), got {shape!r}")
        if self.step_cache_threshold is not None and not self.step_cache_threshold >= 0:
            raise DeployError(f"step_cache_threshold must be >= 0, got {self.step_cache_threshold}")
        budget = self.kv_cache_budget_bytes
        if budget is not None and (not isinstance(budget, int) or isinstance(budget, bool) or budget < 1):
            raise DeployError(f"kv_cache_budget_bytes must be a positive int or None, got {budget!r}")
        pool = self.kv_pool_tokens
        if pool is not None and (not isinstance(pool, int) or isinstance(pool, bool) or pool < 16):
            raise DeployError(f"kv_pool_tokens (--kv-pool-tokens) must be an integer >= 16 (one block), got {pool!r}")
        ttl = self.kv_session_ttl_s
        if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not 0 <= ttl < float("inf"):
            raise DeployError(f"kv_session_ttl_s (--kv-session-ttl) must be a finite number of seconds >= 0, got {ttl!r}")
        if self.vae_tile is not None and (isinstance(self.vae_tile, bool) or self.vae_tile < 1):
            raise DeployError(f"vae_tile (--vae-tile) must be a positive number of pixels, got {self.vae_tile!r}")
        if self.offload_idle_expert and self.cuda_graphs:
            # A captured step reads weights at fixed addresses; moving an expert would leave it reading freed memory.
            raise DeployError("offload_idle_expert moves expert weights between steps; it cannot run with cuda_graphs")
        if self.vae_tile_stride is not None and self.vae_tile is None:
            raise DeployError("vae_tile_stride needs vae_tile")
        self._check_dependents()
        self._check_components()
        self._check_parallel()

    def _check_dependents(self) -> None:
        """Options that only tune another one: set without it they would be accepted and ignored."""
        if self.compile_backend != "inductor" and not self.compile:
            raise DeployError(f"compile_backend={self.compile_backend!r} (--compile-backend) tunes compile; "
                              "it needs compile (--compile)")
        if self.stage2_lora is not None and not (self.two_stage or self.upsampler):
            raise DeployError("stage2_lora (--stage2-lora) is applied in the second stage; it needs two_stage "
                              "(--two-stage) or upsampler (--upsampler)")
        if self.step_cache_threshold is not None and self.step_cache == "none":
            raise DeployError("step_cache_threshold (--step-cache-threshold) needs a step cache (--step-cache)")
        self._check_dbcache()

    def _check_dbcache(self) -> None:
        """DBCache's flags: ranges, and only with a DBCache policy (teacache has no front blocks or masks)."""
        limits = {"step_cache_fn": (1, "--step-cache-fn"), "step_cache_bn": (0, "--step-cache-bn"),
                  "step_cache_warmup": (0, "--step-cache-warmup"), "step_cache_max_cached": (-1, "--step-cache-max-cached"),
                  "step_cache_max_continuous": (-1, "--step-cache-max-continuous"),
                  "step_cache_taylorseer": (0, "--step-cache-taylorseer")}
        for name, (low, flag) in limits.items():
            value = getattr(self, name)
            if value is None:
                continue
            high = MAX_TAYLORSEER_ORDER if name == "step_cache_taylorseer" else MAX_STEP_CACHE_STEPS
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise DeployError(f"{name} ({flag}) must be an integer from {low} to {high}, got {value!r}")
            self._needs_dbcache(name, flag)
        mask = self.step_cache_mask
        if mask is not None:
            if not isinstance(mask, str) or not re.fullmatch(r"((static|dynamic):)?[01]{1,%d}" % MAX_STEP_CACHE_STEPS,
                                                             mask):
                raise DeployError(f"step_cache_mask (--step-cache-mask) is [static:|dynamic:] then one 1 (compute) or "
                                  f"0 (may cache) per step, at most {MAX_STEP_CACHE_STEPS}, got {mask!r}")
            self._needs_dbcache("step_cache_mask", "--step-cache-mask")

    def _needs_dbcache(self, name: str, flag: str) -> None:
        if self.step_cache in ("none", "teacache"):
            raise DeployError(f"{name} ({flag}) tunes DBCache; it needs --step-cache dbcache, fbcache, fast, "
                              f"balanced or quality, not {self.step_cache!r}")

    def _check_components(self) -> None:
        """The shape of each override; whether the card reads that component, and the file, are checked at load.
        A mapping or a list of pairs is accepted and kept as a tuple of pairs (hashable, picklable to workers)."""
        given = self.components
        pairs = given.items() if isinstance(given, Mapping) else given
        try:
            normal = tuple((name, str(path) if isinstance(path, PurePath) else path) for name, path in pairs)
        except (TypeError, ValueError):
            raise DeployError(f"components (--component) maps component names to files, got {given!r}") from None
        object.__setattr__(self, "components", normal)
        seen: set[str] = set()
        for pair in self.components:
            if not (isinstance(pair, tuple) and len(pair) == 2 and all(isinstance(p, str) and p for p in pair)):
                raise DeployError(f"components (--component) entries are (name, file) strings, got {pair!r}")
            name, path = pair
            if name in seen:
                raise DeployError(f"components (--component): {name!r} is given twice")
            seen.add(name)
            if not path.lower().endswith(COMPONENT_FILE_SUFFIXES):
                raise DeployError(f"components (--component) {name}={path}: unsupported file type; a component "
                                  f"file is one of {', '.join(COMPONENT_FILE_SUFFIXES)}")

    def _check_parallel(self) -> None:
        plan = self.parallel
        if not isinstance(self.devices, int) or isinstance(self.devices, bool) or self.devices < 1:
            raise DeployError(f"devices (--devices) must be an integer >= 1, got {self.devices!r}")
        if plan.world_size != self.devices:
            raise DeployError(
                f"devices (--devices) is {self.devices} but the parallel plan {plan.describe()} needs "
                f"sp x cfg = {plan.world_size} processes; choose --sp and --cfg-parallel so that they multiply to "
                f"--devices"
            )
        if plan.cfg > 1 and self.cfg_mode != "sequential":
            raise DeployError(
                f"cfg_mode={self.cfg_mode!r} and CFG-parallel both decide how the two CFG branches run; "
                "with --cfg-parallel leave cfg_mode at 'sequential'"
            )
        sharded_refuses = [flag for flag, on in (("--compile", self.compile), ("--fp8", self.fp8_weights),
                                                  ("--cuda-graphs", self.cuda_graphs),
                                                  ("--offload-idle-expert", self.offload_idle_expert)) if on]
        if plan.shard_weights and sharded_refuses:
            # The hooks swap each block's weights in and out around its forward: a compiled or captured block
            # would hold the freed storages, FP8 layers keep scales outside the flat buffers, and an expert
            # placement keeps whole host copies of every block and uploads them whole.
            raise DeployError(f"--shard-weights gathers each block's weights around its forward, which "
                              f"{', '.join(sharded_refuses)} cannot follow; drop one or the other")
        if plan.world_size > 1 and self.cuda_graphs:
            # A captured step would contain the plan's NCCL collectives (all-to-all, all-gather);
            # capturing collectives needs its own setup and a GPU test that does not exist yet.
            raise DeployError(
                f"cuda_graphs cannot run with a parallel plan ({plan.describe()}) yet: the captured step "
                "would contain NCCL collectives; drop --cuda-graphs or run on one device"
            )

