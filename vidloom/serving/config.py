"""ServeConfig: everything `vidloom serve` can be told, validated once at startup."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from vidloom.core.deploy import DeployConfig
from vidloom.registry import DEFAULT_MODEL
from vidloom.runtime.scheduler import POLICIES


@dataclass(frozen=True)
class ServeConfig:
    """Static server settings (per-request values come in the HTTP body)."""

    model: str = DEFAULT_MODEL  # registered model id, diffusers checkpoint directory or hub repo id
    served_model_name: str | None = None  # the name clients send and /v1/models lists; None = the card's id
    host: str = "127.0.0.1"  # loopback unless the operator opens it up
    port: int = 8000  # 0 picks a free port (printed at startup)
    slots: int = 1  # requests resident on the device at once
    queue_size: int = 16  # requests that may wait for a slot; more get 429
    policy: str = "fifo"  # fifo | interleave (step-level round robin between slots)
    data_dir: Path = Path("vidloom-data")  # SQLite job table and result files
    device: str | None = None  # cuda | cpu; None = cuda when available
    dtype: str | None = None  # float32 | bfloat16 | float16; None = card's on CUDA, float32 on CPU
    deploy: DeployConfig = DeployConfig()  # load-time performance and memory options
    max_body_bytes: int = 1 << 20  # larger request bodies get 413 before any parsing
    max_frames: int = 1025  # bound on num_frames (or seconds * fps) per video
    cancel_wait_s: float = 5.0  # how long POST .../cancel waits for the next step boundary
    keepalive_s: float = 15.0  # SSE comment interval, so proxies keep quiet streams open
    graceful_shutdown_s: float = 5.0  # open SSE streams get this long to finish at shutdown

    def __post_init__(self) -> None:
        object.__setattr__(self, "data_dir", Path(self.data_dir))
        if self.served_model_name is not None and not self.served_model_name.strip():
            raise ValueError("served_model_name: must be a non-empty name")
        if self.policy not in POLICIES:
            raise ValueError(f"policy: unknown {self.policy!r}; known: {', '.join(POLICIES)}")
        for name in ("slots", "queue_size", "max_body_bytes", "max_frames"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port: must be in 0..65535, got {self.port}")
        for name in ("cancel_wait_s", "keepalive_s", "graceful_shutdown_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}: must be > 0, got {getattr(self, name)}")
