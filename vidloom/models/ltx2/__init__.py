"""LTX-2: joint audio-video transformer, video VAE, audio VAE, vocoder, latent upsampler."""
