"""Cosmos3 Omni: the mixture-of-transformers backbone (understanding pathway now; generation pathways in #13)."""
