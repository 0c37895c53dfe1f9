"""What every family's prompt encoder shares: the prompt-embedding cache and weights offloaded to CPU memory."""
