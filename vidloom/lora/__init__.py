"""LoRA adapters applied per request from outside the model (files, the wrapper linear, the resident registry)."""
