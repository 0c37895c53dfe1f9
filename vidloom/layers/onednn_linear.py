"""A linear layer followed by tanh-GELU as one oneDNN call on float32 CPU inference.

PyTorch runs `F.gelu(linear(x), approximate="tanh")` as a GEMM and then a separate pass over its output. On the
CPU that pass is far from free: at the MLP width of a DiT it cost 2.5-7 ms against 3.5 ms for the GEMM itself
(a [256, 512] x [512, 2048] product, one thread, this repo's 2-core Xeon; the slow end with large activations,
where the vectorized tanh takes its long path), 7-9% of a Qwen-Image forward. oneDNN applies the GELU inside the
GEMM's output tile as a post-op (`torch.ops.mkldnn._linear_pointwise`, what inductor emits for the same pattern):
3.5-3.9 ms for both. The weights stay plain (no packed copy), so nothing else about the module changes.

Only plain `nn.Linear` modules without hooks take it (LoRA, quantized and GGUF linears are other classes), only
float32 CPU inference with oneDNN enabled (the same gate as layers.onednn_conv), and not under torch.compile;
anything else runs the two stock calls. oneDNN's GEMM and GELU round differently from MKL's and ATen's by float32 ulps (about 1e-6 relative).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vidloom.layers.onednn_conv import onednn_applies


def _fusable(linear: nn.Module, x: Tensor) -> bool:
    # Under torch.compile the stock calls: inductor fuses them itself, and cannot lower this op on a plain weight.
    return (not torch.compiler.is_compiling() and type(linear) is nn.Linear and onednn_applies(x)
            and linear.weight.dtype == torch.float32 and linear.weight.device.type == "cpu"
            and not linear._forward_hooks and not linear._forward_pre_hooks)


def linear_gelu_tanh(linear: nn.Module, x: Tensor) -> Tensor:
    """`F.gelu(linear(x), approximate="tanh")`, fused into one oneDNN GEMM where `_fusable`."""
    if not _fusable(linear, x):
        return F.gelu(linear(x), approximate="tanh")
    return torch.ops.mkldnn._linear_pointwise(x, linear.weight, linear.bias, "gelu", [], "tanh")
