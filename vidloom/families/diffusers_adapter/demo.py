"""diffusers-adapter-demo: a tiny CogVideoXPipeline with seeded random weights, run by diffusers through the adapter.

CogVideoX has no native recipe, so this folder loads exactly as a user's CogVideoX (or other unknown) checkpoint
does: card from model_index.json and the class's signature, one loop stepped through `callback_on_step_end`.
Unlike the native demos it is written by diffusers itself (`save_pretrained` of randomly initialised modules):
the adapter needs diffusers anyway. Its output is noise by design.
"""

from __future__ import annotations

from pathlib import Path

import torch

from vidloom.core.card import ModelCard
from vidloom.core.errors import CheckpointError
from vidloom.demo.cache import DemoCheckpoint, noise_note
from vidloom.demo.tokenizer import train_t5_tokenizer
from vidloom.families.diffusers_adapter.cards import adapted_card
from vidloom.families.diffusers_adapter.signature import PipelineShape

DEMO_ID = "diffusers-adapter-demo"
DEMO_VERSION = 2  # bump when the demo's architecture or files change
DEMO_SEED = 20261201
DEMO_NOTE = noise_note(DEMO_ID, "CogVideoX", "THUDM/CogVideoX-2b", runner="run by diffusers through the adapter")
TEXT_HIDDEN = 16
# Two VAE levels (2x in space and time) and 2x2 patches: sizes are multiples of 4; 16x16 latent cells by default
# (32x32 pixels), 9 frames (5 latent frames). max_text_seq_length matches the pipeline's default max_sequence_length (226).
DEMO_TRANSFORMER = {
    "num_attention_heads": 2, "attention_head_dim": 8, "in_channels": 4, "out_channels": 4, "time_embed_dim": 8,
    "text_embed_dim": TEXT_HIDDEN, "num_layers": 1, "sample_width": 16, "sample_height": 16, "sample_frames": 9,
    "patch_size": 2, "temporal_compression_ratio": 2, "max_text_seq_length": 226,
}
DEMO_VAE = {
    "down_block_types": ["CogVideoXDownBlock3D"] * 2, "up_block_types": ["CogVideoXUpBlock3D"] * 2,
    "block_out_channels": [8, 8], "latent_channels": 4, "layers_per_block": 1, "norm_num_groups": 2,
    "temporal_compression_ratio": 2,
}
COMPONENTS = ["scheduler", "text_encoder", "tokenizer", "transformer", "vae"]
# CogVideoXPipeline.__call__ as signature.read_shape reads it (diffusers 0.42; a test checks they agree), so that
# listing models does not import diffusers.
DEMO_SHAPE = PipelineShape(
    class_name="CogVideoXPipeline",
    args={name: name for name in ("negative_prompt", "height", "width", "num_frames", "num_inference_steps",
                                  "guidance_scale")},
    defaults={"negative_prompt": None, "height": None, "width": None, "num_frames": None, "num_inference_steps": 50,
              "guidance_scale": 6},
    required=frozenset(), hook="callback_on_step_end", output="video", takes_output_type=True, text_tokens=226,
)


def demo_card() -> ModelCard:
    return adapted_card(DEMO_ID, f"demo:{DEMO_ID}", DEMO_SHAPE, DEMO_TRANSFORMER, DEMO_VAE, COMPONENTS,
                        precision="float32", notes=(DEMO_NOTE,))


def write_demo_checkpoint(folder: Path) -> None:
    """A CogVideoXPipeline folder: T5 encoder (transformers), transformer and VAE (diffusers), random weights."""
    try:
        import diffusers  # noqa: F401
    except ImportError:
        raise CheckpointError(f"{DEMO_ID} runs CogVideoX through diffusers, which is not installed: "
                              "pip install 'vidloom[diffusers]' (from a clone: pip install -e '.[demos]')") from None
    from diffusers import AutoencoderKLCogVideoX, CogVideoXDDIMScheduler, CogVideoXPipeline
    from diffusers import CogVideoXTransformer3DModel
    from transformers import T5Config, T5EncoderModel

    torch.manual_seed(DEMO_SEED)
    tokenizer = train_t5_tokenizer()
    text_encoder = T5EncoderModel(T5Config(vocab_size=len(tokenizer), d_model=TEXT_HIDDEN, d_kv=8, d_ff=32,
                                           num_layers=1, num_heads=2, relative_attention_num_buckets=8))
    pipe = CogVideoXPipeline(
        tokenizer=tokenizer, text_encoder=text_encoder, vae=AutoencoderKLCogVideoX(**DEMO_VAE),
        transformer=CogVideoXTransformer3DModel(**DEMO_TRANSFORMER), scheduler=CogVideoXDDIMScheduler(),
    )
    pipe.save_pretrained(str(folder))


ensure_demo_checkpoint = DemoCheckpoint(DEMO_ID, DEMO_VERSION, write_demo_checkpoint).ensure
