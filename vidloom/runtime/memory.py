"""Device memory: what a device can hold for requests beyond the resident weights (runtime.admission),
and when cached blocks go back to the driver (under memory pressure or on an explicit call).

PyTorch's caching allocator keeps freed blocks for the next request; returning them after
every request (gc + empty_cache) costs a device synchronisation and re-allocation on the
next one. Both run only on the device worker thread, never while another thread captures.
"""

from __future__ import annotations

import gc
from pathlib import Path

import torch

from vidloom.core import plugin
from vidloom.core.instance import ModelInstance
from vidloom.core.limits import MemoryEstimate

# Requests together may use at most this share of what is free, leaving room for the allocator and the process.
USABLE_FRACTION = 0.9
_CGROUP = Path("/sys/fs/cgroup")


def load_estimator(instance: ModelInstance) -> MemoryEstimate | None:
    """The card's memory estimator for `instance`; None when the card (or the instance) gives none."""
    target = instance.card.memory_estimator
    if target is None:
        return None
    return plugin.resolve(target)(instance)


def free_bytes(device: torch.device) -> int | None:
    """Memory free for new work on `device` now; None when it cannot be told."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        # Blocks torch has cached but not handed out are free to the next request too.
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    if device.type == "cpu":
        return host_free_bytes()
    return None


def request_budget(device: torch.device) -> int | None:
    """What the resident requests together may use (runtime.admission): a share of what is free now."""
    free = free_bytes(device)
    return None if free is None else int(free * USABLE_FRACTION)


def host_free_bytes() -> int | None:
    """MemAvailable, tightened by a cgroup v2 limit when the process runs in one (containers)."""
    available = _meminfo_available()
    limit = _read_int(_CGROUP / "memory.max")
    used = _read_int(_CGROUP / "memory.current")
    if limit is not None and used is not None:
        cgroup_free = max(0, limit - used)
        available = cgroup_free if available is None else min(available, cgroup_free)
    return available


def _meminfo_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max" means no limit

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
