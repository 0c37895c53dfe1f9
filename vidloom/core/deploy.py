"""DeployConfig: how a model is deployed on its device, fixed when it is loaded."""

from __future__ import annotations

from dataclasses import dataclass

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

    def __post_init__(self) -> None:
        if self.compile_backend not in COMPILE_BACKENDS:
            raise ValueError(f"compile_backend {self.compile_backend!r} unknown; known: {', '.join(COMPILE_BACKENDS)}")
        if self.prompt_cache_size < 0:
            raise ValueError(f"prompt_cache_size must be >= 0, got {self.prompt_cache_size}")
        for shape in self.warmup_shapes:
            if len(shape) != 3 or min(shape) < 1:
                raise ValueError(f"warmup_shapes entries are (height, width, num_frames), got {shape!r}")
        if self.vae_tile_stride is not None and self.vae_tile is None:
            raise ValueError("vae_tile_stride needs vae_tile")
