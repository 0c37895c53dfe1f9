"""One attention entry point for every model, so backends are swapped in one place."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Scaled dot-product attention over tensors laid out [batch, seq, heads, head_dim].

    Returns the same layout. `mask` is broadcastable to [batch, heads, q_len, k_len]
    (bool: True keeps, or additive float). SDPA is the only backend for now.
    """
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask
    )
    return out.transpose(1, 2)
