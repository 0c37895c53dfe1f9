"""SANA-WM: the camera-controlled bidirectional SANA DiT, its camera input, refiner, cards, program and loop."""
