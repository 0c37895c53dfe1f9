"""Cosmos3 Omni recipes: the card, loading, and the AR decode (chat) loop over the understanding pathway."""
