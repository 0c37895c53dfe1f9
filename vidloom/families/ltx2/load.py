"""Load an LTX-2 card's checkpoint onto our modules: one resident copy per component."""

from __future__ import annotations

from pathlib import Path

import torch

from vidloom.core.card import ModelCard
from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import CheckpointError, DeployError
from vidloom.core.instance import ModelInstance
from vidloom.layers.attention import resolve_attention
from vidloom.loading.diffusers_dir import DiffusersDir
from vidloom.layers.memory_format import use_channels_last
from vidloom.loading.precision import default_compute_dtype, materialize, vae_dtype
from vidloom.loading.component_file import build_component, component_files
from vidloom.loading.safetensors_io import load_weights
from vidloom.lora.files import split_scale
from vidloom.lora.registry import read_adapter, wrap_adapter
from vidloom.models.ltx2.audio_loading import load_audio_vae, load_vocoder
from vidloom.models.ltx2.checkpoint import load_latent_upsampler, load_video_vae
from vidloom.models.ltx2.connectors import LTX2_CONNECTORS_NAME_MAP, LTX2ConnectorsConfig, LTX2TextConnectors
from vidloom.models.ltx2.original_layout import LTX2_TRANSFORMER_LAYOUTS
from vidloom.models.ltx2.transformer import LTX2_TRANSFORMER_NAME_MAP, LTX2Transformer, LTX2TransformerConfig
from vidloom.models.ltx2.upsampler import LTX2LatentUpsampler, check_upsampler_matches
from vidloom.families.ltx2.cards import check_pipeline
from vidloom.families.ltx2.loop import STAGE2_LORA, StageLoRA
from vidloom.families.ltx2.schedule import LTX2Schedule
from vidloom.families.ltx2.settings import LTX2Settings
from vidloom.models.ltx2.text import CONNECTORS, LTX2TextEncoder
from vidloom.text_encoders.elsewhere import encoder_or_elsewhere

UPSAMPLER_FOLDER = "latent_upsampler"  # in Lightricks/LTX-2 and in LTX2LatentUpsamplePipeline folders


def load_instance(
    card: ModelCard, checkpoint: Path, device: torch.device, dtype: torch.dtype | None, deploy: DeployConfig,
    text_encoder_here: bool = True,
) -> ModelInstance:
    """Read `checkpoint` (a diffusers LTX2Pipeline folder); CPU computes in `cpu_default_dtype()`.

    `text_encoder_here`: False on a rank that receives encoded prompts from the rank holding the Gemma 3 encoder
    (parallel.text_encoder_rank): that rank's `text_encoder` is an EncoderElsewhere and Gemma's weights are never
    read. The text connectors load on every rank all the same: they are an instance component that LoRA adapters
    target, and every rank loads the same adapters (the owner runs them on the prompt; the others hold them idle).

    The video VAE follows `vae_dtype` (bfloat16 on the CPU fast path, channels-last there: 57 dB PSNR against
    float32 on bench's ltx2-mid, 3x faster); the audio VAE and the vocoder stay float32 (bfloat16 measured no
    faster at these sizes, docs/performance-cpu.md).
    """
    ckpt = DiffusersDir.open_checked(checkpoint, check_pipeline, card.components)
    files = component_files(deploy.components, ("transformer", "vae"), str(ckpt.root))
    compute = default_compute_dtype(card.precision, device, dtype)
    dit_config = ckpt.parse_component("transformer", LTX2TransformerConfig.from_diffusers)
    connectors_config = ckpt.parse_component("connectors", LTX2ConnectorsConfig.from_diffusers)
    schedule = ckpt.parse_component("scheduler", LTX2Schedule.from_diffusers, "scheduler_config.json")
    attention_fn = resolve_attention(deploy.attention_backend, device, compute, masked=True)  # see its docstring
    transformer = build_component(lambda: LTX2Transformer(dit_config, attention_fn), ckpt.component_dir("transformer"),
                                  LTX2_TRANSFORMER_NAME_MAP, files.get("transformer"), LTX2_TRANSFORMER_LAYOUTS,
                                  device, compute)
    connectors = materialize(lambda: LTX2TextConnectors(connectors_config, attention_fn), device, compute).eval()
    load_weights(connectors, ckpt.component_dir("connectors"), LTX2_CONNECTORS_NAME_MAP)
    text = encoder_or_elsewhere(lambda: LTX2TextEncoder.load(
        ckpt.component_dir("tokenizer"), ckpt.component_dir("text_encoder"), connectors, device, compute,
        offload=deploy.offload_text_encoder, cache_size=deploy.prompt_cache_size,
    ), deploy, text_encoder_here)
    _check_text(ckpt.root, text, connectors_config, dit_config)
    vae = load_video_vae(ckpt.component_dir("vae"), device, vae_dtype(card.components["vae"].dtype, device, compute),
                         files.get("vae"))
    if vae.latents_mean.dtype == torch.bfloat16 and device.type == "cpu":
        use_channels_last(vae)  # oneDNN's bf16 convolutions: 0.27 -> 0.22 s per decode on ltx2-mid
    components = {
        # The connectors are also the text encoder's (where it is here): listed so LoRA adapters can target them.
        "transformer": transformer.eval(), CONNECTORS: connectors, "text_encoder": text, "vae": vae,
        "audio_vae": load_audio_vae(ckpt.component_dir("audio_vae"), device),
        "vocoder": load_vocoder(ckpt.component_dir("vocoder"), device), "schedule": schedule,
        "settings": LTX2Settings(),
    }
    if deploy.two_stage or deploy.upsampler:
        components["upsampler"] = _upsampler(ckpt.root, deploy.upsampler, vae, device)
    if deploy.stage2_lora is not None:
        components[STAGE2_LORA] = _stage2_lora(deploy.stage2_lora, components, card.family, device, compute)
    return ModelInstance(card=card, components=components, device=device, dtype=compute,
                         checkpoint_dir=str(ckpt.root), deploy=deploy)


def _stage2_lora(flag: str, components: dict, family: str, device: torch.device, dtype: torch.dtype) -> StageLoRA:
    """The deployment's stage-2 adapter, read like any LoRA file and wrapped onto the one resident transformer;
    it is in force only inside stage 2's network (LTX2Network), so stage 1 and the requests never see it."""
    path, scale = split_scale(flag, "stage2_lora")
    adapter = read_adapter("stage2", path, components, family, device, dtype)
    touched = sorted(key for key in adapter.layers if key.startswith(CONNECTORS + ":"))
    if touched:  # the prompt is encoded once, before stage 1: a stage-2-only connector update could never apply
        raise CheckpointError(f"{path}: the stage-2 LoRA targets the text connectors ({touched[0]} ...); the prompt "
                              "is encoded before stage 1, so a stage-2 adapter may target the transformer only")
    wrap_adapter(adapter, components)
    return StageLoRA(adapter.layers, scale)


def _upsampler(root: Path, given: str | None, vae: object, device: torch.device) -> LTX2LatentUpsampler:
    """The latent upsampler of the two-stage program: --upsampler DIR, else the checkpoint's own folder."""
    if given is None:
        folder = root / UPSAMPLER_FOLDER
        if not folder.is_dir():
            raise DeployError(f"two_stage (--two-stage) needs a latent upsampler: {root} has no "
                              f"{UPSAMPLER_FOLDER}/ folder; pass --upsampler DIR")
    else:
        folder = Path(given).expanduser()
        if (folder / UPSAMPLER_FOLDER / "config.json").is_file():  # an LTX2LatentUpsamplePipeline folder
            folder = folder / UPSAMPLER_FOLDER
        if not (folder / "config.json").is_file():
            raise CheckpointError(f"upsampler {given}: no config.json (expected an LTX2LatentUpsamplerModel "
                                  f"folder or an LTX2LatentUpsamplePipeline folder with {UPSAMPLER_FOLDER}/)")
    upsampler = load_latent_upsampler(folder, device)
    check_upsampler_matches(upsampler.config, vae.config, str(folder))  # type: ignore[attr-defined]
    return upsampler


def _check_text(root: Path, text: object, connectors: LTX2ConnectorsConfig, dit: LTX2TransformerConfig) -> None:
    """The encoder's hidden states against the connectors (on the rank that holds the encoder), and the connectors'
    width against the transformer's (on every rank)."""
    if isinstance(text, LTX2TextEncoder) and (text.hidden_states != connectors.text_proj_in_factor
                                              or text.hidden_size != connectors.caption_channels):
        raise CheckpointError(
            f"{root}: the text encoder gives {text.hidden_states} hidden states of width {text.hidden_size}, the "
            f"connectors expect {connectors.text_proj_in_factor} of width {connectors.caption_channels}"
        )
    if dit.use_prompt_embeddings and dit.caption_channels != connectors.caption_channels:
        raise CheckpointError(f"{root}: transformer caption_channels {dit.caption_channels} != the connectors' "
                              f"{connectors.caption_channels}")
