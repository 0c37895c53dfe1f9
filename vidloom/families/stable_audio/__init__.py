"""Stable Audio Open: DiT, Oobleck decoder and conditioning projection (T5 runs through transformers), cards, loading and loop."""
