"""AnyFlow-FAR (causal chunked Wan2.1): card, loader, chunk-rollout loop and T2V program."""
