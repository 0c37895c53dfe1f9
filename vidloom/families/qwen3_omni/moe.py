"""Qwen3-MoE feed-forward layers: the sparse block (top-k router over stacked experts, optional shared expert)
and the dense gated SiLU MLP that layers off the sparse grid use.

Experts are stacked tensors ([experts, out, in]), loaded row by row from the checkpoint's per-expert tensors
(`experts.{e}.gate_proj.weight` -> row e of `gate`). A forward groups the (token, expert) assignments of every
packed token by expert (one stable sort), runs each expert once over its gathered rows (three grouped GEMMs where
torch has them, else a loop over the hit experts), and scatters the weighted results back with one index_add: the
work is batched by expert across all sequences of the step. The loop sizes its groups on the host; a captured decode
step (`fixed_shapes`, runtime.decode_graphs) takes a path whose every shape follows x's instead (`fixed_experts`).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class GatedMLP(nn.Module):
    """down(silu(gate(x)) * up(x)), no biases (a dense layer's MLP, and the talker's shared expert)."""

    def __init__(self, hidden: int, inner: int) -> None:
        super().__init__()
        self.gate = nn.Linear(hidden, inner, bias=False)
        self.up = nn.Linear(hidden, inner, bias=False)
        self.down = nn.Linear(inner, hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class SparseMoE(nn.Module):
    """Softmax router, top-k experts per token (renormalised when `normalize`), weighted sum of their outputs;
    plus a sigmoid-gated shared expert when `shared_inner` > 0 (Qwen3-Omni's talker)."""

    def __init__(self, hidden: int, inner: int, experts: int, top_k: int, normalize: bool,
                 shared_inner: int = 0) -> None:
        super().__init__()
        self.top_k, self.normalize = top_k, normalize
        self.router = nn.Parameter(torch.zeros(experts, hidden))
        self.gate = nn.Parameter(torch.zeros(experts, inner, hidden))
        self.up = nn.Parameter(torch.zeros(experts, inner, hidden))
        self.down = nn.Parameter(torch.zeros(experts, hidden, inner))
        self.shared = GatedMLP(hidden, shared_inner) if shared_inner > 0 else None
        self.shared_gate = nn.Linear(hidden, 1, bias=False) if shared_inner > 0 else None

    def route(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """x [T, hidden] -> (weights [T, k] in x's dtype, expert ids [T, k]). The softmax and top-k run in float32
        and the weights round once, as the checkpoint's reference router does."""
        probs = F.linear(x, self.router).softmax(-1, dtype=torch.float32)
        weights, chosen = probs.topk(self.top_k, dim=-1)
        if self.normalize:
            weights = weights / weights.sum(-1, keepdim=True)
        return weights.to(x.dtype), chosen

    def forward(self, x: Tensor, fixed_shapes: bool = False) -> Tensor:
        """x [T, hidden] (packed tokens of every sequence in the step) -> [T, hidden]. `fixed_shapes`: no host read
        (a captured decode step): `fixed_experts` instead of the grouped dispatch."""
        weights, chosen = self.route(x)
        out = self.fixed_experts(x, weights, chosen) if fixed_shapes else self.experts(x, weights, chosen)
        if self.shared is not None and self.shared_gate is not None:
            out = out + torch.sigmoid(self.shared_gate(x)) * self.shared(x)
        return out

    def experts(self, x: Tensor, weights: Tensor, chosen: Tensor) -> Tensor:
        # 1. (token, expert) assignments sorted by expert: row i of `rows` is the input of token `token[i]`
        flat = chosen.reshape(-1)
        order = flat.argsort(stable=True)
        token = order // self.top_k
        rows, scale = x.index_select(0, token), weights.reshape(-1).index_select(0, order)
        counts = torch.bincount(flat, minlength=self.gate.shape[0])
        # 2. one gated MLP per expert over its contiguous rows
        out = _grouped_mlp(rows, counts, self.gate, self.up, self.down) if _has_grouped_mm(x) else \
            _looped_mlp(rows, counts, self.gate, self.up, self.down)
        # 3. weighted, summed back onto the tokens
        return torch.zeros_like(x).index_add_(0, token, out * scale[:, None])

    def fixed_experts(self, x: Tensor, weights: Tensor, chosen: Tensor) -> Tensor:
        """`experts` with every shape fixed by x's (no host read, so a CUDA graph can hold it; vLLM's fused MoE
        kernels pad their groups for the same reason). Few pairs (T * k <= experts, a small decode batch): each
        (token, expert) pair through its own expert's weights, gathered per pair, so only the chosen experts are
        read. More: every expert over every token, weighted by the routing weight (0 where not chosen), which reads
        each expert once instead of copying them per pair."""
        t, k = chosen.shape
        experts = self.gate.shape[0]
        if t * k <= experts:
            flat = chosen.reshape(-1)
            rows = x.unsqueeze(1).expand(t, k, x.shape[1]).reshape(t * k, x.shape[1], 1)
            hidden = F.silu(torch.bmm(self.gate[flat], rows)) * torch.bmm(self.up[flat], rows)  # [t * k, inner, 1]
            out = torch.bmm(self.down[flat], hidden).view(t, k, -1)
            return (out * weights.unsqueeze(2)).sum(1)
        hidden = F.silu(torch.einsum("th,eih->eti", x, self.gate)) * torch.einsum("th,eih->eti", x, self.up)
        out = torch.einsum("eti,ehi->eth", hidden, self.down)  # [experts, t, hidden]
        dense = torch.zeros(t, experts, dtype=x.dtype, device=x.device).scatter_(1, chosen, weights)
        return torch.einsum("eth,te->th", out, dense)


def _has_grouped_mm(x: Tensor) -> bool:
    """torch's grouped GEMM runs every dtype on CPU; on CUDA only bfloat16 (SM80+)."""
    if not hasattr(F, "grouped_mm"):
        return False
    return x.device.type == "cpu" or (x.dtype == torch.bfloat16 and _sm80(x.device))


@functools.lru_cache(maxsize=None)
def _sm80(device: torch.device) -> bool:
    """Asked once per device, not at every layer of every step."""
    return torch.cuda.get_device_capability(device)[0] >= 8


def _grouped_mlp(rows: Tensor, counts: Tensor, gate: Tensor, up: Tensor, down: Tensor) -> Tensor:
    """All experts in three grouped GEMMs (the group ends stay on the device: no host read per layer). Each group's
    rows are the same GEMM as `_looped_mlp`'s F.linear (within 1e-7 of the peak in float32 on CPU,
    tests/unit/families/test_qwen3_omni_thinker.py); transformers' default experts implementation uses the same
    kernel."""
    ends = counts.cumsum(0).to(torch.int32)
    gated = F.silu(F.grouped_mm(rows, gate.transpose(1, 2), offs=ends))
    hidden = gated * F.grouped_mm(rows, up.transpose(1, 2), offs=ends)
    return F.grouped_mm(hidden, down.transpose(1, 2), offs=ends)


def _looped_mlp(rows: Tensor, counts: Tensor, gate: Tensor, up: Tensor, down: Tensor) -> Tensor:
    """One F.linear triple per hit expert (group sizes: one host read per layer)."""
    outs = []
    for expert, part in enumerate(rows.split(counts.tolist())):
        if part.shape[0]:
            hidden = F.silu(F.linear(part, gate[expert])) * F.linear(part, up[expert])
            outs.append(F.linear(hidden, down[expert]))
    return torch.cat(outs)
