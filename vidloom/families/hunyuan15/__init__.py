"""HunyuanVideo-1.5: its dual-stream transformer (our own), the Qwen2.5-VL + ByT5 text path, cards, loading, loop
and program (text to video, image to video)."""
