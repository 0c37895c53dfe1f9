"""vidloom: a model-native inference runtime for video generation."""

from vidloom.core.errors import Cancelled, CheckpointError, InvalidRequest, UnknownModel
from vidloom.core.output import VideoOutput
from vidloom.core.request import GenerationRequest, Task
from vidloom.generator import VideoGenerator
from vidloom.runtime.engine import CancellationToken

__all__ = [
    "Cancelled",
    "CancellationToken",
    "CheckpointError",
    "GenerationRequest",
    "InvalidRequest",
    "Task",
    "UnknownModel",
    "VideoGenerator",
    "VideoOutput",
]
__version__ = "0.1.0"
