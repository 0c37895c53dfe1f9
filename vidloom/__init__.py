"""vidloom: a model-native inference runtime for video generation."""

from vidloom.core.errors import Cancelled, CheckpointError, InvalidRequest, UnknownModel, WorkerFailed
from vidloom.core.output import VideoOutput
from vidloom.core.parallel import ParallelPlan
from vidloom.core.request import GenerationRequest, Task
from vidloom.generator import VideoGenerator
from vidloom.runtime.engine import CancellationToken

__all__ = [
    "Cancelled",
    "CancellationToken",
    "CheckpointError",
    "GenerationRequest",
    "InvalidRequest",
    "ParallelPlan",
    "Task",
    "UnknownModel",
    "VideoGenerator",
    "VideoOutput",
    "WorkerFailed",
]
__version__ = "0.1.0"
