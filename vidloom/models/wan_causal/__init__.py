"""Causal chunked Wan (AnyFlow-FAR): block-causal DiT with a per-layer KV cache and compressed far context."""
