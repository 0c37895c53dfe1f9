"""AnyFlow-FAR (causal chunked Wan2.1): block-causal DiT with a per-layer KV cache and compressed far context; card, loader, chunk-rollout loop and program."""
