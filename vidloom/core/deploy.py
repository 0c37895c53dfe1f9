"""DeployConfig: how a model is deployed on its device, fixed when it is loaded."""

from __future__ import annotations

from dataclasses import dataclass

from vidloom.core.errors import DeployError

COMPILE_BACKENDS = ("inductor", "aot_eager", "eager")


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
    """Decode in spatial tiles of this many pixels (None: whole frames) to bound peak memory."""
    vae_tile_stride: int | None = None
    """Pixels between tile starts (default: 3/4 of vae_tile); the rest of each tile is blended."""
    attention_backend: str = "sdpa"
    """Attention kernel of the DiT: "sdpa" (PyTorch), "flash" (flash-attn) or "sage" (SageAttention); checked at load."""
    cfg_mode: str = "sequential"
    """How CFG runs its two branches: "sequential" (two forwards, the reference) or "batched" (one forward of batch 2)."""
    step_cache: str = "none"
    """Step cache policy: "none", "teacache" or "fbcache" (first-block cache); skips DiT blocks on steps that barely change."""
    step_cache_threshold: float | None = None
    """Default step-cache threshold (None: the policy's own); requests may override it. 0 never skips."""

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
        if self.vae_tile_stride is not None and self.vae_tile is None:
            raise DeployError("vae_tile_stride needs vae_tile")
