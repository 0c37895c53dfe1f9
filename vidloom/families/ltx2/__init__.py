"""LTX-2: cards, loading, the joint audio-video denoise loop and program (the networks are shared: vidloom.models.ltx2)."""
