"""HunyuanVideo-1.5 LoRA: a PEFT adapter on the transformer (diffusers has no LoRA loader for these pipelines),
per request through the engine vs the pipeline with the adapter injected by PEFT; ours decodes with our VAE, the pipeline with diffusers'."""

from __future__ import annotations

import numpy as np
import torch

from tests.helpers.hunyuan15_checkpoints import system_turn_tokens, write_pipeline
from tests.helpers.lora_files import LoRASpec, write_peft_lora
from vidloom.core.request import GenerationRequest
from vidloom.generator import VideoGenerator

TOLERANCE = 1e-4  # float32 frames in [0, 1]; the base frames match to ~3e-6
MIN_EFFECT = 1e-2
# Both streams' attention and MLP linears, the modulations, the text refiner's attention (the same `attn.to_q`
# names), the glyph projection and the head.
SPEC = LoRASpec(rank=4, alpha=8, seed=31, std=0.1, targets=(
    r".*(attn\.(to_q|to_k|to_v|add_q_proj|add_v_proj|to_out\.0|to_add_out)|ff\.net\.0\.proj|ff_context\.net\.2"
    r"|norm1\.linear|context_embedder_2\.linear_1|proj_out)"))
PROMPT = 'a sign that says "open"'
BASE = dict(height=32, width=48, num_frames=9, num_inference_steps=3, seed=7)


def test_a_request_adapter_matches_the_pipeline_with_peft(tmp_path):
    pipe = write_pipeline(tmp_path / "ckpt", "p1")
    pipe.prompt_template_encode_start_idx = system_turn_tokens(pipe.tokenizer)
    (tmp_path / "loras").mkdir()
    lora = write_peft_lora(pipe.transformer, SPEC, tmp_path / "loras", "hv15-lora")
    gen = VideoGenerator.from_pretrained(tmp_path / "ckpt", device="cpu", dtype=torch.float32)
    gen.load_lora("peft", lora)
    try:
        adapted = gen.engine.run(GenerationRequest(prompt=PROMPT, loras=(("peft", 1.0),), **BASE))["video"]
        plain = gen.engine.run(GenerationRequest(prompt=PROMPT, **BASE))["video"]
    finally:
        gen.unload_lora("peft")
    with torch.no_grad():
        theirs = pipe(prompt=PROMPT, height=32, width=48, num_frames=9, num_inference_steps=3,
                      generator=torch.Generator().manual_seed(7), output_type="np").frames[0]
    assert adapted.shape == theirs.shape
    assert float(np.abs(adapted - theirs).max()) < TOLERANCE
    assert float(np.abs(adapted - plain).max()) > MIN_EFFECT  # the adapter acted
