"""Cards for LTX-2 diffusers folders (LTX2Pipeline / LTX2ImageToVideoPipeline): video with its own soundtrack."""

from __future__ import annotations

import math
from pathlib import Path

from vidloom.core.capabilities import Capabilities
from vidloom.core.card import Geometry, LoopSpec, ModelCard, SamplingDefaults
from vidloom.core.card_kit import FamilyCards, component_table, refusals
from vidloom.core.request import Task
from vidloom.loading.diffusers_dir import DiffusersDir
from vidloom.models.ltx2.checkpoint import read_video_vae_config
from vidloom.models.ltx2.text import LTX2_TEXT_TOKENS

FAMILY = "ltx2"
PIPELINE_CLASSES = ("LTX2Pipeline", "LTX2ImageToVideoPipeline")
PROGRAM = "vidloom.families.ltx2.program:build_program"
MEMORY_ESTIMATOR = "vidloom.families.ltx2.memory:request_estimator"
# LTX2Pipeline.__call__ defaults: 768x512, 121 frames at 24 fps, 30 steps, video CFG 3.0. flow_shift is
# not read: the schedule shifts by the token count (use_dynamic_shifting) as the pipeline does.
DEFAULTS = SamplingDefaults(height=512, width=768, num_frames=121, fps=24, num_inference_steps=30,
                            guidance_scale=3.0, flow_shift=1.0, sampler="euler", negative_prompt="")
# The pipelines refuse sizes that are not multiples of 32 (check_inputs), whatever the VAE's factor.
PIPELINE_SIZE_MULTIPLE = 32
CAPABILITIES = Capabilities(
    # attention_backend: the transformer and the text connectors take sdpa or math; LTX-2 masks every attention
    # call, so flash/sage (no masks) are refused at load (layers.attention.resolve_attention, masked=True).
    # cuda_graphs: both stages' steps, returning (video, audio); positions and prompts are graph inputs.
    # devices, cfg_parallel: the video and audio streams each sharded (padded), the guidance passes spread over the
    # CFG ranks (parallel.token_layout). text_encoder_rank: Gemma 3 on that rank alone, which runs the prompt node
    # (Gemma, then the connectors under the request's adapters) and broadcasts the connectors' output; the connectors
    # stay on every rank, a LoRA target like the transformer (load.py).
    frozenset({"warmup_shapes", "offload_text_encoder", "prompt_cache_size", "two_stage", "step_cache", "compile",
               "fp8_weights", "vae_tile", "attention_backend", "cuda_graphs", "components", "batching", "devices",
               "cfg_parallel", "text_encoder_rank"}),
    refusals("kv_pool_tokens", "kv_session_ttl_s", "offload_idle_expert",
             cfg_mode="LTX-2 always runs its CFG pair as one batched forward, as LTX2Pipeline does; no other mode "
                      "is written",
             kv_cache_budget_bytes="a bidirectional denoiser keeps no KV cache to budget"),
)
CARDS = FamilyCards(FAMILY, PROGRAM, MEMORY_ESTIMATOR, CAPABILITIES)
CAPABILITY_ROWS = {FAMILY: CAPABILITIES}  # `vidloom models --capabilities`


# LTX2Pipeline / LTX2ImageToVideoPipeline.__init__ components (diffusers 0.42), plus the latent upsampler the
# two-stage program reads from the same folder. `processor` and `prompt_enhancer` serve only the pipeline's
# prompt enhancement, which no request here can ask for, so a folder may list them (they are not loaded).
INDEX_COMPONENTS = ("scheduler", "vae", "audio_vae", "text_encoder", "tokenizer", "connectors", "transformer",
                    "vocoder", "processor", "prompt_enhancer", "latent_upsampler")
# Listed with a class, these change what the pipeline does for a request we accept: refused by name.
INDEX_UNSUPPORTED = {
    "duration_head": "it predicts num_frames when a request omits it; vidloom uses the card's default instead",
}


def check_pipeline(ckpt: DiffusersDir) -> None:
    """An LTX-2 pipeline folder whose model_index.json holds only keys this loader reads."""
    ckpt.expect_pipeline(*PIPELINE_CLASSES)
    ckpt.check_index(INDEX_COMPONENTS, unsupported=INDEX_UNSUPPORTED)


def card_from_checkpoint(path: str | Path) -> ModelCard:
    """A card for an LTX-2 folder; the VAE's factors (times the patch sizes) set the size rules."""
    ckpt = DiffusersDir.open(path)
    check_pipeline(ckpt)
    vae = read_video_vae_config(ckpt.component_dir("vae"))
    dit = ckpt.component_config("transformer")
    spatial = vae.spatial_compression_ratio * int(dit.get("patch_size", 1))
    temporal = vae.temporal_compression_ratio * int(dit.get("patch_size_t", 1))
    multiple = math.lcm(PIPELINE_SIZE_MULTIPLE, spatial)
    return ltx2_card(ckpt.root.name, str(ckpt.root), multiple=multiple, temporal=temporal, defaults=DEFAULTS,
                     description=f"LTX-2 text/image-to-video with audio from {ckpt.root}")


def ltx2_card(model_id: str, source: str, *, multiple: int, temporal: int, defaults: SamplingDefaults,
              description: str, notes: tuple[str, ...] = (), precision: str = "bfloat16") -> ModelCard:
    """The card of an LTX-2 folder whose sizes are multiples of `multiple` pixels and whose frames are
    `temporal` * k + 1."""
    return CARDS.card(
        model_id, source, {"stage1": LoopSpec(samplers=("euler",)), "stage2": LoopSpec(samplers=("euler",))},
        components=component_table(precision, "transformer", "connectors", "text_encoder", "tokenizer", "vae",
                                   "audio_vae", "vocoder", "scheduler", float32=("vae", "audio_vae", "vocoder")),
        tasks=frozenset({Task.T2V, Task.I2V}), inputs=frozenset({"image"}), min_image_side=1, produces_audio=True,
        precision=precision, sampling_defaults=defaults,
        geometry=Geometry(spatial_multiple=multiple, temporal_factor=temporal),
        description=description, notes=notes, max_prompt_tokens=LTX2_TEXT_TOKENS,
    )
