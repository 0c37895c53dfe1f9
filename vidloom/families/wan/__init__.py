"""Wan 2.1 / 2.2 / FastWan: cards, loading, conditioning, the denoise loop and program (the networks are shared: vidloom.models.wan)."""
