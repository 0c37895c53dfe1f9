"""The reference side of a parity test: a diffusers pipeline loaded as every parity test runs it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


def reference_pipeline(pipeline_class: Any, folder: Path | str, **kwargs: Any) -> Any:
    """`pipeline_class` (a diffusers pipeline) from `folder` in float32, its progress bar off."""
    pipe = pipeline_class.from_pretrained(str(folder), dtype=torch.float32, **kwargs)
    pipe.set_progress_bar_config(disable=True)
    return pipe
