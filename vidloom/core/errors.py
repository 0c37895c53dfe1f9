"""User-facing exceptions: each names the field, file or key a user can act on."""

from __future__ import annotations


def counted(count: int, noun: str) -> str:
    """"1 frame", "0 frames", "5 frames": a count and its regular noun, for the lines users read."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


class VidloomError(Exception):
    """Base class for every error vidloom raises on purpose."""


class InvalidRequest(VidloomError, ValueError):
    """A generation request that cannot run as given; `field` names the culprit."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class LimitExceeded(InvalidRequest):
    """A request over one of the work limits (core.limits.RequestLimits); `limit` names the setting."""

    def __init__(self, field: str, message: str, limit: str) -> None:
        super().__init__(field, message)
        self.limit = limit


class CheckpointError(VidloomError):
    """A checkpoint directory or file that cannot be loaded onto our modules."""


class InvalidCard(VidloomError, ValueError):
    """A ModelCard whose fields contradict each other."""


class UnknownModel(VidloomError, KeyError):
    """A model id that is neither registered nor a checkpoint directory."""

    def __str__(self) -> str:  # KeyError quotes its message otherwise
        return str(self.args[0]) if self.args else ""


class Cancelled(VidloomError):
    """A run stopped at a step boundary because its cancellation token was set."""


class CacheBudgetExceeded(VidloomError):
    """A request's KV cache does not fit in what the deployment's cache budget has left."""

    def __init__(self, needed: int, in_use: int, budget: int, reason: str | None = None) -> None:
        """Bytes by default; a paged pool counts blocks and says so in `reason` (the whole message)."""
        super().__init__(reason or (
            f"the request needs {needed} bytes of KV cache but only {budget - in_use} of "
            f"kv_cache_budget_bytes={budget} are free ({in_use} held by running requests and sessions in use); "
            "retry later, ask for fewer frames or a smaller size, or raise the budget"
        ))
        self.needed = needed
        self.in_use = in_use
        self.budget = budget
        self.reason = reason

    def __reduce__(self) -> tuple[type, tuple[int, int, int, str | None]]:
        return (type(self), (self.needed, self.in_use, self.budget, self.reason))


class KVPoolBusy(CacheBudgetExceeded):
    """A paged KV sequence that fits its empty pool but not the blocks free now (other sequences hold them): a
    transient condition, which a run stepped among others waits out (RequestRun.kv_wait)."""


class NonFiniteOutput(VidloomError):
    """The model produced NaN or inf values (bad weights, overflow in low precision)."""

    @classmethod
    def of(cls, what: str, dtype: object) -> "NonFiniteOutput":
        """`what` produced NaN/inf while computing in `dtype`, with the hint that fits that dtype."""
        name = str(dtype).removeprefix("torch.")
        if name == "float16":
            hint = "float16 overflows easily: use bfloat16 or float32 (--dtype)"
        else:
            hint = (f"computing in {name} already, so a lower precision is not the cause: check the checkpoint's "
                    "weights and extreme request values (guidance_scale, flow_shift)")
        return cls(f"{what} produced NaN/inf latents ({hint})")


class DeployError(VidloomError, ValueError):
    """A DeployConfig option this installation or device cannot honour; raised at load, never mid-request."""


class WorkerFailed(VidloomError):
    """A worker process of a multi-device pool died, timed out in a collective, or fell out of lockstep.

    The request it was running fails; the pool is broken until restarted (see ParallelEngine).
    """

    def __init__(self, rank: int | None, reason: str) -> None:
        where = f"rank {rank}" if rank is not None else "worker pool"
        super().__init__(f"{where}: {reason}")
        self.rank = rank
        self.reason = reason

    def __reduce__(self) -> tuple[type, tuple[int | None, str]]:
        return (type(self), (self.rank, self.reason))
