"""Cosmos3 Omni: the mixture-of-transformers backbone, its cards, loading, generation and chat loops, actions and sessions."""
