"""Helios: its transformer (our own), Wan's VAE and UMT5 text path."""
