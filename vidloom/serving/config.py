"""ServeConfig: everything `vidloom serve` can be told, validated once at startup."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from vidloom.core.card import ModelCard
from vidloom.core.deploy import DeployConfig
from vidloom.core.limits import RequestLimits
from vidloom.registry import DEFAULT_MODEL
from vidloom.serving.api_keys import SINGLE_KEY_OWNER, ApiKey, KeyRing, check_unique, read_keys_file
from vidloom.serving.job_store import LOST_JOBS, redact_url
from vidloom.runtime.scheduler import DEFAULT_DECODE_SLOTS, POLICIES

LOOPBACK_BINDS = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class ServeConfig:
    """Static server settings (per-request values come in the HTTP body)."""

    model: str = DEFAULT_MODEL  # registered model id, diffusers checkpoint directory or hub repo id
    served_model_name: str | None = None  # the name clients send and /v1/models lists; None = the card's id
    host: str = "127.0.0.1"  # loopback unless the operator opens it up
    port: int = 8000  # 0 picks a free port (printed at startup)
    slots: int = 1  # requests resident on the device at once
    queue_size: int = 16  # requests that may wait for a slot; more get 429
    # AR sequences (chats) decoding in one batched step at most (--decode-slots): each decode forward carries
    # every resident one; more wait in the same queue (runtime.scheduler, vLLM's max_num_seqs)
    decode_slots: int = DEFAULT_DECODE_SLOTS
    policy: str = "fifo"  # fifo | interleave (step-level round robin between slots) | batch (shared forwards)
    max_batch: int | None = None  # batch policy: request-steps per forward (default: slots)
    batch_wait_s: float = 0.0  # batch policy: wait this long for more requests before a step with room
    data_dir: Path = Path("vidloom-data")  # result files (and the SQLite job table, the default store)
    # Job table: None = SQLite in data_dir; "postgresql://user@host/db" = PostgreSQL, shared by servers
    # (data_dir must then be a directory they all mount). The password is best left to $PGPASSWORD.
    store: str | None = None
    # Active jobs of a server that died: "fail" them (error lost_worker / server_restart) or "requeue" them
    # for the next server to run, at most max_requeues times per job (a job that kills servers stops there).
    lost_jobs: str = "fail"
    max_requeues: int = 1
    recovery_interval_s: float = 5.0  # how often a server on a shared store looks for jobs of dead servers
    device: str | None = None  # cuda | cpu; None = cuda when available
    dtype: str | None = None  # float32 | bfloat16 | float16; None = card's on CUDA, cpu_default_dtype() on CPU
    deploy: DeployConfig = DeployConfig()  # load-time performance and memory options
    # LoRA adapters loaded at start, "NAME=PATH" each (--lora); more load at run time through POST /v1/loras.
    # With fuse_loras (--fuse-loras) they are added into the base weights at load instead, "NAME=PATH[:SCALE]"
    # each: faster steps, but requests may name no other adapters and the load/unload routes answer 409.
    loras: tuple[str, ...] = ()
    fuse_loras: bool = False
    max_loras: int | None = None  # adapters resident at once (--max-loras); None: 4 (vidloom.lora.registry)
    # POST /v1/loras reads files only inside these folders (--lora-dir, repeatable), after resolving symlinks;
    # none: run-time loading is off. Adapters past these bounds are refused before they take memory.
    lora_dirs: tuple[Path, ...] = ()
    max_lora_rank: int = 1024  # the largest rank of any layer (community adapters: 4 to 256)
    max_lora_file_bytes: int = 4 << 30  # the largest adapter file read (--max-lora-mb)
    max_body_bytes: int = 1 << 20  # larger request bodies get 413 before any parsing
    # Uploads (images, videos) are checked from their headers and decoded on a pool off the event loop:
    # this many threads, with this many more uploads waiting; past that a request gets 429.
    media_workers: int = 2
    media_queue: int = 16
    # Work per request (core.limits.RequestLimits); None takes the default derived from the model card.
    max_pixels: int | None = None  # width * height of one frame (card: 4x its default size)
    max_frames: int | None = None  # num_frames, or seconds * fps (card: 4x its default latent frames)
    max_steps: int | None = None  # num_inference_steps (card: 20x its default)
    # prompt / negative_prompt length (card: 16 chars per text token, which core validation enforces on every
    # path, so this can only tighten it)
    max_prompt_chars: int | None = None
    # Estimated peak per request; unset, the runtime's device budget alone applies (90% of what was free after
    # loading, shared by the resident requests: one waits in the queue until the others leave it room).
    max_request_memory_bytes: int | None = None
    # POST /v1/audio/generations' uploaded init_audio: the longest file it decodes, in seconds (None: the model's
    # window, the most of it the model reads). Its bytes are bounded by max_body_bytes.
    max_init_audio_seconds: float | None = None
    # Chat media parts, sized from their headers before any is decoded (serving/chat_media.py): what one chat's
    # decode to (float32 16 kHz audio, RGB images; more is a 400), and what the chats being decoded and prepared
    # hold at once (past it a 429 media_busy). 32 MiB is about 8.7 minutes of audio.
    max_chat_media_bytes: int = 32 << 20
    chat_media_budget_bytes: int = 128 << 20
    # Wall time of one speech run (POST /v1/audio/speech, a chat answered aloud), seconds: refused up front when
    # the server's measured pace says it cannot fit, stopped (504) when it runs past it (serving/request_budget.py).
    max_request_seconds: float | None = 300.0
    # Connections (uvicorn): bounds on slow or idle clients so they cannot hold sockets forever.
    header_timeout_s: float = 10.0  # a request's headers must arrive within this long (slowloris)
    body_timeout_s: float = 30.0  # and its body within this long after the headers
    keep_alive_timeout_s: float = 5.0  # an idle keep-alive connection is closed after this long
    # Open API connections. At the cap a new connection closes the one idle longest (no request in
    # progress); if all are busy it may call /health and /metrics only (503 otherwise), within
    # probe_connections more; past those it gets 503 and is closed (serving/http_protocol.py).
    max_connections: int = 256
    probe_connections: int = 16  # the reserve above for probes and scrapers; also the cap of health_port
    health_port: int | None = None  # a second listener serving only /health and /metrics (0: a free port)
    sse_queue_size: int = 64  # progress updates buffered per event-stream reader; older ones are dropped
    cancel_wait_s: float = 5.0  # how long POST .../cancel waits for the next step boundary
    keepalive_s: float = 15.0  # SSE comment interval, so proxies keep quiet streams open
    # On SIGTERM/SIGINT queued jobs fail at once (server_restart); running jobs get this long to finish,
    # then fail too. Each open event stream gets its job's final event before the server exits.
    graceful_shutdown_s: float = 5.0

    # -- security (who may call, from where) --------------------------------------------------
    api_key: str | None = None  # required as `Authorization: Bearer <key>` on every route but /health (an admin key)
    # Several keys, each with a role (admin | user) and an owner whose jobs and sessions it alone sees
    # (serving/api_keys.py): the card's list and a file of `KEY ROLE OWNER` lines or JSON (--api-keys-file).
    api_keys: tuple[ApiKey, ...] = ()
    api_keys_file: Path | None = None
    metrics_need_key: bool = False  # /metrics also requires the key (open by default, for scrapers)
    allowed_hosts: tuple[str, ...] = ()  # Host names beyond the bind address, localhost and IP literals; "*": any
    cors_origins: tuple[str, ...] = ()  # browser origins allowed to call the API (no CORS headers otherwise)
    enable_docs: bool = False  # serve /docs, /redoc and /openapi.json
    # The web playground at / (vidloom/serving/ui): None = on when bound to loopback, off on other addresses.
    ui: bool | None = None

    @property
    def lora_files(self) -> list[tuple[str, str]]:
        """`loras` as (name, path) pairs; ValueError naming the entry that is not NAME=PATH."""
        return [(name, path) for name, path, _ in self.lora_entries]

    @property
    def lora_entries(self) -> list[tuple[str, str, float]]:
        """`loras` as (name, path, scale); a `:SCALE` suffix only with fuse_loras (run-time adapters take their
        scale from each request). ValueError naming the entry that is not NAME=PATH[:SCALE]."""
        from vidloom.core.errors import InvalidRequest
        from vidloom.lora.files import split_scale
        from vidloom.lora.registry import check_lora_name

        entries = []
        for entry in self.loras:
            name, sep, path = str(entry).partition("=")
            if not sep or not name.strip() or not path.strip():
                raise ValueError(f"loras: {entry!r} is not NAME=PATH (e.g. watercolor=./watercolor.safetensors)")
            try:
                check_lora_name(name.strip(), "loras")
            except InvalidRequest as exc:
                raise ValueError(f"loras: {exc.message}") from None
            path, scale = path.strip(), 1.0
            if self.fuse_loras:
                try:
                    file, scale = split_scale(path, "loras")
                except InvalidRequest as exc:
                    raise ValueError(f"loras: {exc.message}") from None
                path = str(file)
            entries.append((name.strip(), path, scale))
        return entries

    def __post_init__(self) -> None:
        object.__setattr__(self, "data_dir", Path(self.data_dir))
        if self.served_model_name is not None and not self.served_model_name.strip():
            raise ValueError("served_model_name: must be a non-empty name")
        if self.policy not in POLICIES:
            raise ValueError(f"policy: unknown {self.policy!r}; known: {', '.join(POLICIES)}")
        for name in ("slots", "decode_slots", "queue_size", "max_body_bytes", "max_connections", "probe_connections",
                     "sse_queue_size", "media_workers", "max_chat_media_bytes", "chat_media_budget_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
        for name in ("max_pixels", "max_frames", "max_steps", "max_prompt_chars", "max_request_memory_bytes"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name}: must be >= 1, got {value}")
        if self.max_request_seconds is not None and not self.max_request_seconds > 0:
            raise ValueError(f"max_request_seconds: must be > 0, got {self.max_request_seconds}")
        if self.max_init_audio_seconds is not None and not self.max_init_audio_seconds > 0:
            raise ValueError(f"max_init_audio_seconds: must be > 0, got {self.max_init_audio_seconds}")
        if self.media_queue < 0:
            raise ValueError(f"media_queue: must be >= 0, got {self.media_queue}")
        object.__setattr__(self, "loras", tuple(self.loras))
        object.__setattr__(self, "lora_dirs", tuple(Path(d) for d in self.lora_dirs))
        for name in ("max_lora_rank", "max_lora_file_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
        self.lora_files  # noqa: B018 -- raises for an entry that is not NAME=PATH
        if self.fuse_loras and not self.loras:
            raise ValueError("fuse_loras: needs adapters given at start (loras / --lora NAME=PATH[:SCALE])")
        if self.max_loras is not None and self.max_loras < max(1, len(self.loras)):
            raise ValueError(f"max_loras: must be >= 1 and >= the {len(self.loras)} adapters in loras, "
                             f"got {self.max_loras}")
        if self.lost_jobs not in LOST_JOBS:
            raise ValueError(f"lost_jobs: unknown {self.lost_jobs!r}; known: {', '.join(LOST_JOBS)}")
        if self.max_requeues < 0:
            raise ValueError(f"max_requeues: must be >= 0, got {self.max_requeues}")
        if self.store is not None and self.store != "sqlite" and not self.store.startswith(
                ("postgresql://", "postgres://")):
            raise ValueError(f"store: {redact_url(self.store)!r} is not a job store; "
                             "use sqlite (the default) or postgresql://...")
        if self.max_batch is not None and not 1 <= self.max_batch <= self.slots:
            raise ValueError(f"max_batch: must be between 1 and slots ({self.slots}), got {self.max_batch}")
        if not 0.0 <= self.batch_wait_s < 60.0:
            raise ValueError(f"batch_wait_s: must be in [0, 60) seconds, got {self.batch_wait_s}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port: must be in 0..65535, got {self.port}")
        if self.health_port is not None and not 0 <= self.health_port <= 65535:
            raise ValueError(f"health_port: must be in 0..65535, got {self.health_port}")
        if self.health_port is not None and self.health_port != 0 and self.health_port == self.port:
            raise ValueError(f"health_port: must differ from port ({self.port})")
        for name in ("cancel_wait_s", "keepalive_s", "recovery_interval_s", "graceful_shutdown_s", "header_timeout_s", "body_timeout_s",
                     "keep_alive_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}: must be > 0, got {getattr(self, name)}")
        self._check_security()

    def _check_security(self) -> None:
        if self.api_key is not None and (not self.api_key.strip() or not self.api_key.isascii()):
            raise ValueError("api_key: must be a non-empty ASCII string (or unset for no authentication)")
        object.__setattr__(self, "api_keys", tuple(self.api_keys))
        if self.api_keys_file is not None:
            object.__setattr__(self, "api_keys_file", Path(self.api_keys_file))
        check_unique(self.all_keys)  # reads the keys file: a bad one stops the start
        object.__setattr__(self, "allowed_hosts", tuple(h.strip().lower() for h in self.allowed_hosts))
        object.__setattr__(self, "cors_origins", tuple(o.strip().rstrip("/") for o in self.cors_origins))
        for host in self.allowed_hosts:
            if not host or "/" in host or " " in host:
                raise ValueError(f"allowed_hosts: {host!r} is not a host name (e.g. example.com, 10.0.0.5 or *)")
        for origin in self.cors_origins:
            if origin != "*" and not origin.startswith(("http://", "https://")):
                raise ValueError(f"cors_origins: {origin!r} must look like https://app.example.com (or be *)")

    @property
    def all_keys(self) -> tuple[ApiKey, ...]:
        """Every key of the server: --api-key (an admin), the card's api_keys, the keys file's (read now)."""
        single = (ApiKey(self.api_key, "admin", SINGLE_KEY_OWNER),) if self.api_key is not None else ()
        from_file = read_keys_file(self.api_keys_file) if self.api_keys_file is not None else ()
        return (*single, *self.api_keys, *from_file)

    @property
    def key_ring(self) -> KeyRing:
        return KeyRing(self.all_keys)

    @property
    def ui_enabled(self) -> bool:
        return self.ui if self.ui is not None else self.host.lower() in LOOPBACK_BINDS

    def request_limits(self, card: ModelCard, memory_budget: int | None) -> RequestLimits:
        """The server's per-request limits: card-derived defaults, replaced by any field set here.

        `memory_budget` bounds one request's memory estimate (the server passes None: the device budget is the
        runtime's, Engine.admission); an explicit max_request_memory_bytes wins over it.
        """
        derived = RequestLimits.from_card(card, max_memory_bytes=memory_budget)
        return derived.with_overrides(
            max_pixels=self.max_pixels, max_frames=self.max_frames, max_steps=self.max_steps,
            max_prompt_chars=self.max_prompt_chars, max_memory_bytes=self.max_request_memory_bytes,
        )
