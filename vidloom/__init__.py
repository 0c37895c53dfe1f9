"""vidloom: a model-native inference runtime for video generation.

The public names load on first use (PEP 562), so `import vidloom.cli` stays light: the `vidloom` command
takes Ctrl-C before torch is imported (see cli/interrupt.py). Importing vidloom before torch sets libgomp's
wait policy for the engine's worker thread (core/openmp.py; never over the user's own setting).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vidloom.core import plugin
from vidloom.core.openmp import spin_then_sleep

spin_then_sleep()  # before torch loads libgomp (a no-op once it has, or where the user chose)

if TYPE_CHECKING:
    from vidloom.core.action import ActionInput
    from vidloom.core.errors import Cancelled, CheckpointError, InvalidRequest, UnknownModel, WorkerFailed
    from vidloom.core.output import VideoOutput
    from vidloom.core.parallel import ParallelPlan
    from vidloom.core.request import GenerationRequest, Task
    from vidloom.generator import VideoGenerator
    from vidloom.runtime.engine import CancellationToken

# public name -> the module defining it
_EXPORTS = {
    "ActionInput": "vidloom.core.action",
    "Cancelled": "vidloom.core.errors",
    "CancellationToken": "vidloom.runtime.engine",
    "CheckpointError": "vidloom.core.errors",
    "GenerationRequest": "vidloom.core.request",
    "InvalidRequest": "vidloom.core.errors",
    "ParallelPlan": "vidloom.core.parallel",
    "Task": "vidloom.core.request",
    "UnknownModel": "vidloom.core.errors",
    "VideoGenerator": "vidloom.generator",
    "VideoOutput": "vidloom.core.output",
    "WorkerFailed": "vidloom.core.errors",
}
__all__ = sorted(_EXPORTS)
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'vidloom' has no attribute {name!r}")
    value = plugin.resolve(f"{module}:{name}")
    globals()[name] = value  # once: later lookups do not come back here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
