"""Linear followed by tanh-GELU, fused into one oneDNN call for float32 CPU inference.

A tanh-GELU feed-forward (Wan, Wan-causal, Helios, LTX-2, Qwen-Image, HunyuanVideo-1.5, the Qwen-Omni speech
DiT; SANA-WM's and LTX-2's caption projections) writes its [tokens, 4-6x width] up-projection to memory,
then reads it back for the GELU and writes it again. oneDNN's linear with a GELU post-op
(`torch.ops.mkldnn._linear_pointwise(x, w, b, "gelu", [], "tanh")`) applies the activation to each output tile
while it is still in cache. Measured on this repo's 2-core Zen 3 (float32, one thread, best of 5 interleaved CPU
seconds; bench/results/cpu_efficiency.json, "gemm_epilogue"): Wan2.1-1.3B's FFN up [512 x 1536] x [1536 x 8960]
106.3 -> 95.7 ms (1.11x), at 2048 tokens 453 -> 412 ms (1.10x); a 5120 -> 13824 FFN at 512 tokens 1.05x, LTX-2's
4096 -> 16384 at 1024 tokens 1.02x (the wider K, the smaller the activation's share). The output differs from
F.linear + F.gelu by float32 rounding only (oneDNN's own GEMM blocking and GELU): at most 7e-6 on O(1) outputs.
The residual-add variant (`_linear_pointwise.binary(..., "add")`) measured slower than F.linear + add (0.93-0.98x)
and is not used.

Taken only where nothing else must see the linear run: float32 CPU inference with no autograd and oneDNN on
(layers.onednn_conv's rule), a plain nn.Linear (a LoRALinear with an active adapter on the layer, an
FP8Linear or a GGUFLinear keeps its own forward, so adapters and quantized weights take effect; a LoRALinear
with none active runs as its base), float32 strided CPU weights, no hooks on the linear, and not while
torch.compile traces (Inductor fuses on its own). A --shard-weights block's linears run with their whole weights
gathered and take it too, so their bits are one process's. CUDA, bf16 and training take the stock path.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vidloom.layers.onednn_conv import onednn_applies


def fused_applies(linear: nn.Module, x: Tensor) -> bool:
    """Whether `linear(x)` followed by an activation may run as one oneDNN call (see the module docstring)."""
    if type(linear) is not nn.Linear or not onednn_applies(x) or torch.compiler.is_compiling():
        return False
    weight = linear.weight
    return (weight.dtype == torch.float32 and weight.device.type == "cpu" and weight.layout == torch.strided
            and x.shape[-1] == weight.shape[1] and x.numel() > 0
            and not linear._forward_hooks and not linear._forward_pre_hooks)


def _plain(linear: nn.Module) -> nn.Module | None:
    """The module whose output `linear(x)` is in the current scope: a LoRA wrapper with no active adapter on it
    names its base (`unadapted`), so loading and then unloading adapters leaves the fused path, and its bits, as
    they were; an active adapter: None (the wrapper must run)."""
    unadapted = getattr(linear, "unadapted", None)
    if not callable(unadapted):
        return linear
    return None if linear._forward_hooks or linear._forward_pre_hooks else unadapted()


def linear_gelu_tanh(linear: nn.Module, x: Tensor) -> Tensor:
    """`F.gelu(linear(x), approximate="tanh")`, one oneDNN call where `fused_applies` to the linear that runs."""
    plain = _plain(linear)
    if plain is not None and fused_applies(plain, x):
        return torch.ops.mkldnn._linear_pointwise(x, plain.weight, plain.bias, "gelu", [], "tanh")
    return F.gelu(linear(x), approximate="tanh")
