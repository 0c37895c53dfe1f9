"""Qwen2.5-Omni: thinker and talker decoders, token2wav (flow-matching DiT and BigVGAN vocoder), cards, loading and the speech program."""
