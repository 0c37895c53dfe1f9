"""When cached device memory goes back to the driver: under memory pressure or on an explicit call.

PyTorch's caching allocator keeps freed blocks for the next request; returning them after
every request (gc + empty_cache) costs a device synchronisation and re-allocation on the
next one. Both run only on the device worker thread, never while another thread captures.
"""

from __future__ import annotations

import gc

import torch

MEMORY_PRESSURE_FRACTION = 0.9
"""Release cached blocks after a request only when the device is more than this full (driver's view)."""


def under_pressure(device: torch.device, fraction: float = MEMORY_PRESSURE_FRACTION) -> bool:
    """True when `device` is CUDA, its free memory is below (1 - fraction) of the total, and the
    allocator holds cached blocks it could give back."""
    if device.type != "cuda":
        return False
    free, total = torch.cuda.mem_get_info(device)
    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return free < (1 - fraction) * total and cached > 0


def release_cached_memory(device: torch.device) -> None:
    """Collect garbage and return the allocator's unused blocks to the driver (CUDA only)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
