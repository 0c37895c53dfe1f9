"""SANA-WM: the camera-controlled bidirectional SANA DiT (stage 1 of the SANA-WM world model)."""
