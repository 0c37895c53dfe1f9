"""SANA-WM: camera-controlled image-to-video world model (card, camera input, program, loop)."""
