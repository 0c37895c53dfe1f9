"""What the Wan-architecture demos (wan2.1, wan2.2, AnyFlow-FAR) share in how their random weights are written."""

from __future__ import annotations

# Cross-attention logits x4 (q and k norms x2): the prompt's ~10 tokens then outweigh Wan's ~500 identical
# zero-padding tokens, which at default init take ~97% of the attention, so the text reaches the video.
CROSS_ATTENTION_SCALE = (("blocks.*.cross_attn.norm_[qk].weight", 2.0),)
