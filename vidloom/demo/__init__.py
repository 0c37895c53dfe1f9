"""Demo checkpoints: the cache they are written to once (tiny real architectures with seeded random weights)."""
