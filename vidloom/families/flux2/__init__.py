"""FLUX.2 Klein: the double/single-stream transformer, its VAE, cards, loading, loop and program (text to image and edits)."""
