"""Load a Wan2.1 card's checkpoint onto our modules: one resident copy per component."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from vidloom.core.card import ModelCard
from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import CheckpointError
from vidloom.core.instance import ModelInstance
from vidloom.diffusion.sampler import load_sampler_config
from vidloom.loading.config_keys import read_key, strict_bool
from vidloom.loading.diffusers_dir import DiffusersDir
from vidloom.layers.attention import AttentionFn, resolve_attention
from vidloom.layers.fp8 import check_fp8_compute, quantize_linears
from vidloom.layers.prompt_kv import padding_key_multiple
from vidloom.loading.precision import default_compute_dtype
from vidloom.loading.precision import vae_dtype as vae_compute_dtype
from vidloom.loading.component_file import build_component, component_files
from vidloom.models.wan.transformer import WanTransformer
from vidloom.models.wan.loading import load_vae_and_text
from vidloom.models.wan.original_layout import WAN_TRANSFORMER_LAYOUTS
from vidloom.models.wan.transformer_config import WAN_TRANSFORMER_NAME_MAP, WanTransformerConfig
from vidloom.families.wan.conditioning import WanPipelineConfig
from vidloom.families.wan.experts import ExpertPlacement

# model_index.json pipeline classes whose folders this loader reads. FastVideo's WanDMDPipeline is not a
# diffusers class: FastVideo's registry finds its DMD-distilled FastWan repos by that name; their folders are
# Wan diffusers folders (registered.FASTWAN_PIPELINE).
WAN_PIPELINES = ("WanPipeline", "WanImageToVideoPipeline", "WanVideoToVideoPipeline", "WanDMDPipeline")
# Each one's __init__ arguments (diffusers 0.42): its components and pipeline settings, the only keys its
# model_index.json may hold. A folder without _class_name is read as the widest (the I2V pipeline's). The
# image pair is loaded only when the transformer takes CLIP tokens (Wan2.1 I2V / FLF2V).
_T2V_KEYS = ("tokenizer", "text_encoder", "vae", "scheduler", "transformer", "transformer_2", "boundary_ratio",
             "expand_timesteps")
WAN_INDEX_KEYS = {
    "WanPipeline": _T2V_KEYS,
    "WanImageToVideoPipeline": (*_T2V_KEYS, "image_processor", "image_encoder"),
    # diffusers' video-to-video pipeline runs one expert with one timestep per sample: no settings at all.
    "WanVideoToVideoPipeline": ("tokenizer", "text_encoder", "transformer", "vae", "scheduler"),
    # FastWan2.1 folders hold WanPipeline's keys; FastWan2.2-TI2V-5B adds Wan2.2's expand_timesteps.
    "WanDMDPipeline": _T2V_KEYS,
}


def load_instance(
    card: ModelCard,
    checkpoint: Path,
    device: torch.device,
    dtype: torch.dtype | None,
    deploy: DeployConfig,
    text_encoder_here: bool = True,
) -> ModelInstance:
    """Read `checkpoint` (a diffusers WanPipeline folder) and build the resident instance.

    `dtype` overrides the card's precision for the DiT and text encoder; by default
    CUDA runs the card's precision and CPU runs `cpu_default_dtype()` (bfloat16 where the CPU
    multiplies it natively). The VAE keeps its card dtype on CUDA and follows the compute dtype on CPU
    (`vae_dtype`: bfloat16 on the fast path, float32 otherwise).
    `text_encoder_here`: False on a rank that receives encoded prompts from the rank holding the text encoder
    (parallel.text_encoder_rank): that rank's `text_encoder` is an EncoderElsewhere and its weights are never read.
    """
    if card.recipe.quantization == "fp8" and not deploy.fp8_weights:
        deploy = dataclasses.replace(deploy, fp8_weights=True)  # QAD-trained weights are meant to run in FP8
    ckpt = DiffusersDir.open(checkpoint)
    if ckpt.pipeline_class not in (*WAN_PIPELINES, ""):
        raise CheckpointError(
            f"{ckpt.root}: model_index.json says {ckpt.pipeline_class!r}, expected one of {', '.join(WAN_PIPELINES)}"
        )
    ckpt.check_index(WAN_INDEX_KEYS[ckpt.pipeline_class or "WanImageToVideoPipeline"])
    ckpt.require(card.components)
    files = component_files(deploy.components, [n for n in ("transformer", "transformer_2", "vae") if ckpt.has(n)],
                            str(ckpt.root))
    compute = default_compute_dtype(card.precision, device, dtype)
    vae_dtype = vae_compute_dtype(card.components["vae"].dtype, device, compute)
    if deploy.fp8_weights:
        check_fp8_compute(device, compute)  # before any weight reaches the device

    attention_fn = resolve_attention(deploy.attention_backend, device, compute)  # fails here, not mid-request
    experts = {
        name: _load_transformer(ckpt, name, device, compute, attention_fn, deploy, files.get(name))
        for name in ("transformer", "transformer_2")
        if ckpt.has(name)
    }
    if "transformer" not in experts:
        raise CheckpointError(f"{ckpt.root}: no 'transformer' component")
    pipeline = pipeline_config(ckpt)
    if (pipeline.boundary_ratio is None) != ("transformer_2" not in experts):
        raise CheckpointError(
            f"{ckpt.root}: a 'transformer_2' expert and boundary_ratio come together in model_index.json"
        )
    vae, text = load_vae_and_text(ckpt, device, compute, deploy, files.get("vae"), text_encoder_here)
    sampler_config = load_sampler_config(ckpt)

    components: dict = {
        **experts,
        "vae": vae.to(device=device, dtype=vae_dtype).eval(),
        "text_encoder": text,
        "sampler_config": sampler_config,
        "wan_pipeline": pipeline,
    }
    if deploy.offload_idle_expert and len(experts) > 1:
        components["expert_placement"] = ExpertPlacement(experts, device)
    if ckpt.has("image_encoder") and not experts["transformer"].config.takes_image:
        # diffusers would feed its CLIP tokens to a transformer without image_dim and fail; we would drop them.
        raise CheckpointError(f"{ckpt.root}/model_index.json: image_encoder is listed, but transformer/config.json "
                              f"has no image_dim to read its tokens")
    if experts["transformer"].config.takes_image:
        from vidloom.families.wan.image_encoder import WanImageEncoder  # CLIP: image-to-video checkpoints only

        components["image_encoder"] = WanImageEncoder.load(
            ckpt.component_dir("image_processor"), ckpt.component_dir("image_encoder"), device, compute
        )
    return ModelInstance(card=card, components=components, device=device, dtype=compute,
                         checkpoint_dir=str(ckpt.root), deploy=deploy)


def pipeline_config(ckpt: DiffusersDir) -> WanPipelineConfig:
    """The loop options diffusers keeps in model_index.json."""
    ratio = ckpt.index.get("boundary_ratio")
    try:
        boundary = None if ratio is None else float(ratio)
    except (TypeError, ValueError):
        raise CheckpointError(f"{ckpt.root}/model_index.json: boundary_ratio={ratio!r} is not a number") from None
    if boundary is not None and not 0.0 < boundary < 1.0:
        raise CheckpointError(f"{ckpt.root}/model_index.json: boundary_ratio={boundary} must be in (0, 1)")
    expand = read_key(ckpt.index, "expand_timesteps", False, strict_bool, f"{ckpt.root}/model_index.json")
    return WanPipelineConfig(expand_timesteps=expand, boundary_ratio=boundary)


def _load_transformer(
    ckpt: DiffusersDir, name: str, device: torch.device, compute: torch.dtype, attention_fn: AttentionFn,
    deploy: DeployConfig, file: Path | None = None,
) -> WanTransformer:
    config = ckpt.parse_component(name, WanTransformerConfig.from_diffusers)
    transformer = build_component(lambda: WanTransformer(config, attention_fn), ckpt.component_dir(name),
                                  WAN_TRANSFORMER_NAME_MAP, file, WAN_TRANSFORMER_LAYOUTS, device, compute,
                                  WanTransformer.KEEP_FP32)
    _apply_deploy(transformer, deploy)
    return transformer.eval()


def _apply_deploy(transformer: WanTransformer, deploy: DeployConfig) -> None:
    """Performance options applied from outside the model at load: quantize (the runtime compiles the
    blocks afterwards, through WanTransformer.compile_units), collapse the prompt's padding keys where the attention
    backend and --compile allow (layers.prompt_kv)."""
    transformer.prompt_key_multiple = padding_key_multiple(deploy)
    if deploy.fp8_weights:
        # Block linears hold ~all DiT weights; embeddings and the head stay in full precision.
        quantize_linears(transformer.blocks)
