"""Qwen2.5-Omni speech family: cards, loading, the speech program (thinker -> talker -> token2wav -> vocoder)."""
