"""Attention backends behind one calling convention, chosen once at load from an explicit registry.

Every backend takes q, k, v laid out [batch, seq, heads, head_dim] and returns that
layout. `attention` (PyTorch SDPA) is the default and the reference; `math` is SDPA held
to PyTorch's math kernel (float32 accumulation everywhere: a reference when a fused kernel
is in doubt); `flash` (flash-attn) and `sage` (SageAttention) are optional CUDA kernels.
A model receives the chosen function at construction, so nothing here is global or mutable.

Models that attend inside their KV stores (the AR decoders: causal, paged, always masked) take
an `SDPAScope` instead (`resolve_sdpa_scope`): the SDPA kernels their calls may use, entered
around their blocks. Kernels without masks are refused for them at load.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from vidloom.core import plugin
from vidloom.core.errors import DeployError


class AttentionFn(Protocol):
    """q [B, S, H, D], k/v [B, L, H, D] -> [B, S, H, D]; `mask` broadcastable to [B, H, S, L]."""

    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor: ...


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Scaled dot-product attention (PyTorch SDPA) over tensors laid out [batch, seq, heads, head_dim].

    Returns the same layout. `mask` is broadcastable to [batch, heads, q_len, k_len]
    (bool: True keeps, or additive float).
    """
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask
    )
    return out.transpose(1, 2)


def _no_mask(backend: str, mask: torch.Tensor | None) -> None:
    # Wan attends without masks; a kernel that cannot mask must not silently ignore one.
    if mask is not None:
        raise ValueError(f"attention backend {backend!r} does not take an attention mask")


def _flash(kernel: Callable[..., torch.Tensor]) -> AttentionFn:
    def flash_attention(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        _no_mask("flash", mask)
        return kernel(q, k, v)  # flash_attn_func already takes and returns [B, S, H, D]

    return flash_attention


def _sage(kernel: Callable[..., torch.Tensor]) -> AttentionFn:
    def sage_attention(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        _no_mask("sage", mask)
        return kernel(q, k, v, tensor_layout="NHD", is_causal=False)  # NHD == [B, S, H, D]

    return sage_attention


_HALF = frozenset({torch.float16, torch.bfloat16})


@dataclass(frozen=True)
class AttentionBackend:
    """One registry entry: where the kernel lives and what it needs to run."""

    kernel: str | None
    """"module:function" of the third-party kernel, imported only when chosen (None: built in)."""
    package: str
    """pip package that provides `kernel`, named in the error when it is missing."""
    adapt: Callable[[Callable[..., torch.Tensor]], AttentionFn] | None
    """Wraps the kernel into our calling convention (None: `attention` itself)."""
    needs_cuda: bool = False
    """The kernel only runs on CUDA devices."""
    dtypes: frozenset[torch.dtype] | None = None
    """Compute dtypes the kernel accepts (None: any)."""
    takes_mask: bool = True
    """The kernel takes an attention mask (flash-attn's and SageAttention's dense calls do not)."""
    sdpa_kernels: tuple[SDPBackend, ...] | None = None
    """Built-in entries only: the PyTorch SDPA kernels allowed (None: PyTorch picks among all)."""


ATTENTION_BACKENDS: dict[str, AttentionBackend] = {
    "sdpa": AttentionBackend(kernel=None, package="torch", adapt=None),
    "math": AttentionBackend(kernel=None, package="torch", adapt=None, sdpa_kernels=(SDPBackend.MATH,)),
    "flash": AttentionBackend("flash_attn:flash_attn_func", "flash-attn", _flash, needs_cuda=True, dtypes=_HALF,
                              takes_mask=False),
    "sage": AttentionBackend("sageattention:sageattn", "sageattention", _sage, needs_cuda=True, dtypes=_HALF,
                             takes_mask=False),
}
"""Backend name (DeployConfig.attention_backend, --attention-backend) -> entry."""


def resolve_attention(name: str, device: torch.device, dtype: torch.dtype, masked: bool = False) -> AttentionFn:
    """The attention function for backend `name`, or DeployError saying why it cannot run here.

    Called at load, so a missing package or a CUDA-only kernel on CPU fails before any
    request, and never falls back to another backend silently. `masked`: the model passes
    an attention mask on every call (LTX-2's padded text), so a kernel without masks is refused.
    """
    backend = ATTENTION_BACKENDS.get(name)
    if backend is None:
        raise DeployError(f"unknown attention backend {name!r}; known: {', '.join(ATTENTION_BACKENDS)}")
    if masked and not backend.takes_mask:
        takes = ", ".join(repr(n) for n, b in ATTENTION_BACKENDS.items() if b.takes_mask)
        raise DeployError(f"attention_backend {name!r} takes no attention mask, and this model masks every "
                          f"attention call; use attention_backend {takes}")
    if backend.kernel is None or backend.adapt is None:
        return attention if backend.sdpa_kernels is None else _held_to(backend.sdpa_kernels)
    if backend.needs_cuda and device.type != "cuda":
        raise DeployError(f"attention backend {name!r} needs a CUDA device; this model is loading on {device.type}")
    kernel = _import_kernel(name, backend)
    if backend.dtypes is not None and dtype not in backend.dtypes:
        allowed = ", ".join(sorted(str(d).removeprefix("torch.") for d in backend.dtypes))
        raise DeployError(
            f"attention backend {name!r} runs in {allowed} only; this model computes in "
            f"{str(dtype).removeprefix('torch.')} (pass dtype='bfloat16')"
        )
    return backend.adapt(kernel)


def _held_to(kernels: tuple[SDPBackend, ...]) -> AttentionFn:
    scope = SDPAScope(kernels)

    def held_attention(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        with scope():
            return attention(q, k, v, mask)

    return held_attention


@dataclass(frozen=True)
class SDPAScope:
    """The PyTorch SDPA kernels a model's attention calls may use; calling it gives the context to run them in.

    `torch.nn.attention.sdpa_kernel` sets process-wide flags for the duration of the context: the runtime steps
    one model at a time per device worker, so a scope is held for one forward and restored after it.
    """

    kernels: tuple[SDPBackend, ...] | None = None
    """None: PyTorch picks among all its kernels (the `sdpa` backend)."""

    def __call__(self) -> AbstractContextManager[Any]:
        return nullcontext() if self.kernels is None else sdpa_kernel(list(self.kernels))


DEFAULT_SDPA = SDPAScope()
"""The `sdpa` backend's scope: no restriction."""


def resolve_sdpa_scope(name: str, device: torch.device, dtype: torch.dtype) -> SDPAScope:
    """The SDPA scope of backend `name` for a model whose attention runs inside its KV stores with a mask on every
    call (causal and paged AR decode), or DeployError at load: flash/sage take no mask, so they are refused."""
    resolve_attention(name, device, dtype, masked=True)  # unknown names, kernels without masks: refused here
    return SDPAScope(ATTENTION_BACKENDS[name].sdpa_kernels)


def _import_kernel(name: str, backend: AttentionBackend) -> Callable[..., Any]:
    assert backend.kernel is not None
    try:
        return plugin.resolve(backend.kernel)
    except (ImportError, AttributeError) as exc:
        raise DeployError(
            f"attention backend {name!r} needs the {backend.package!r} package, which is not importable here "
            f"({type(exc).__name__}: {exc}); install it, or use attention_backend='sdpa'"
        ) from None
