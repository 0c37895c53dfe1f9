"""Token decoding: per-sequence sampling and incremental detokenization with stop strings (AR loops)."""
