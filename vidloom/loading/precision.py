"""Cast a loaded module to its compute dtype, keeping precision-sensitive parts in float32."""

from __future__ import annotations

import os
from typing import Callable

import torch

from vidloom.core.errors import DeployError
from vidloom.loading.host_blocks import allocate


def cast_module(module: torch.nn.Module, dtype: torch.dtype, keep_fp32: frozenset[str] = frozenset()) -> torch.nn.Module:
    """Cast floating parameters/buffers to `dtype`, except those with a name segment in `keep_fp32`.

    Mirrors diffusers' `_keep_in_fp32_modules`, so bf16 runs match the reference.
    """
    module.to(dtype)
    if dtype == torch.float32 or not keep_fp32:
        return module
    for name, param in module.named_parameters():
        if keep_fp32.intersection(name.split(".")):
            param.data = param.data.float()
    return module


def materialize(
    build: Callable[[], torch.nn.Module],
    device: torch.device,
    dtype: torch.dtype,
    keep_fp32: frozenset[str] = frozenset(),
) -> torch.nn.Module:
    """Build a module on the meta device, cast it, then allocate it (uninitialised) on `device`.

    Skips random init and any full-precision copy: the checkpoint fills every tensor
    next. Modules with non-persistent buffers can't be built this way (nothing would
    fill them), so they are refused.
    """
    with torch.device("meta"):
        module = build()
    persistent = set(module.state_dict())
    derived = [name for name, _ in module.named_buffers() if name not in persistent]
    if derived:
        raise TypeError(f"{type(module).__name__} has non-persistent buffers {derived[:3]}; build it eagerly")
    return allocate(cast_module(module, dtype, keep_fp32), device)  # a held denoiser's blocks stay on the host


# The CPU fast path. On CPUs whose matmul units take bfloat16 natively (Intel AMX, AVX512-BF16,
# Arm's BF16 extension) oneDNN runs a bf16 linear ~3-4x faster than float32 (measured here:
# 449 vs 119 GFLOP/s on a 1536x6144 linear), so generation defaults to bfloat16 there, keeping the
# same float32 islands as on CUDA (each model's KEEP_FP32 modules, float32 norms, modulation,
# RoPE and sampler state). VIDLOOM_CPU_DTYPE=float32|bfloat16 overrides the probe for the process.
CPU_DTYPE_ENV = "VIDLOOM_CPU_DTYPE"
_CPU_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
_BF16_FLAGS = frozenset({"amx_bf16", "avx512_bf16", "bf16"})  # x86 "flags" / aarch64 "Features" names


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> frozenset[str]:
    """The feature flags the kernel reports for the first CPU (empty where /proc is absent)."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):
                    return frozenset(value.split())
    except OSError:
        pass
    return frozenset()


def cpu_has_native_bf16(flags: frozenset[str] | None = None, capability: str | None = None) -> bool:
    """True when this CPU multiplies bfloat16 in hardware and PyTorch dispatches to a kernel that uses it.

    Both must hold: the flag (AMX / AVX512-BF16 / Arm BF16) and a PyTorch CPU capability at least
    AVX512 (x86) or an Arm SVE/NEON build; with ATEN_CPU_CAPABILITY forced down to AVX2, bf16 is
    emulated and slower than float32.
    """
    flags = cpu_flags() if flags is None else flags
    capability = torch.backends.cpu.get_cpu_capability() if capability is None else capability
    if not _BF16_FLAGS & flags:
        return False
    if "bf16" in flags and not {"amx_bf16", "avx512_bf16"} & flags:  # Arm: capability names are SVE*/DEFAULT
        return True
    return capability.upper().startswith("AVX512")


def cpu_default_dtype() -> torch.dtype:
    """What generation computes in on CPU when nobody asked: bfloat16 with native bf16 matmul, else float32.

    VIDLOOM_CPU_DTYPE (float32 | bfloat16) pins it, e.g. for parity work; another value is refused by name.
    """
    forced = os.environ.get(CPU_DTYPE_ENV, "").strip()
    if forced:
        if forced not in _CPU_DTYPES:
            raise DeployError(f"{CPU_DTYPE_ENV}: {forced!r} is not supported; use float32 or bfloat16")
        return _CPU_DTYPES[forced]
    return torch.bfloat16 if cpu_has_native_bf16() else torch.float32


def default_compute_dtype(card_precision: str, device: torch.device, requested: torch.dtype | None) -> torch.dtype:
    """The DiT / text-encoder dtype: `requested` if given, else the card's precision on CUDA, else the CPU default."""
    if requested is not None:
        return requested
    if device.type == "cuda":
        return getattr(torch, card_precision)
    return cpu_default_dtype()


def vae_dtype(card_vae_dtype: str | None, device: torch.device, compute: torch.dtype) -> torch.dtype:
    """A VAE whose bfloat16 decode was measured within the quality gate: the card's dtype on CUDA (float32 when
    it names none); on CPU bfloat16 when generation computes in bfloat16 (the fast path: channels-last bf16
    convolutions run ~5x float32's on AMX), else float32, so `dtype="float32"` keeps the whole run exact.
    """
    if device.type == "cuda":
        return getattr(torch, card_vae_dtype or "float32")
    return torch.bfloat16 if compute == torch.bfloat16 else torch.float32
