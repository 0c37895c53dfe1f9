"""HunyuanVideo-1.5: text and image to video."""
