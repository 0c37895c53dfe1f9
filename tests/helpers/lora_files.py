"""Random LoRA files written by peft + diffusers' save_lora_weights on a tiny checkpoint's transformer.

PEFT initialises lora_B to zero (an adapter that changes nothing, so parity would pass with LoRA broken);
both factors are re-drawn here with a std large enough that the adapter moves the frames by many uint8 levels.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch


@dataclass(frozen=True)
class LoRASpec:
    """One adapter: rank, alpha, target modules (PEFT names), optional per-module alpha, random seed."""

    rank: int
    alpha: float
    targets: tuple[str, ...] | str  # PEFT target_modules: names (suffix match) or one regex (whole-name match)
    seed: int
    alpha_pattern: dict = field(default_factory=dict)
    std: float = 0.3


def write_lora(checkpoint: Path, pipeline: str, spec: LoRASpec, out: Path, with_metadata: bool = True) -> Path:
    """Write `out/<pipeline>-<seed>.safetensors`: a random LoRA on `checkpoint`'s transformer."""
    import diffusers
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    pipeline_cls = getattr(diffusers, pipeline)
    transformer_cls = {"WanPipeline": diffusers.WanTransformer3DModel,
                       "Flux2KleinPipeline": diffusers.Flux2Transformer2DModel,
                       "AnyFlowFARPipeline": diffusers.AnyFlowFARTransformer3DModel,
                       "LTX2Pipeline": diffusers.LTX2VideoTransformer3DModel}[pipeline]
    transformer = transformer_cls.from_pretrained(str(checkpoint / "transformer"), torch_dtype=torch.float32)
    config = LoraConfig(r=spec.rank, lora_alpha=spec.alpha, target_modules=spec.targets if isinstance(spec.targets, str) else list(spec.targets),
                        alpha_pattern=dict(spec.alpha_pattern), init_lora_weights=True)
    transformer.add_adapter(config, adapter_name="default")
    g = torch.Generator().manual_seed(spec.seed)
    with torch.no_grad():
        for name, param in transformer.named_parameters():
            if ".lora_A." in name or ".lora_B." in name:
                param.copy_(torch.randn(param.shape, generator=g) * spec.std)
    state = get_peft_model_state_dict(transformer, adapter_name="default")
    weight_name = f"{pipeline}-{spec.seed}.safetensors"
    pipeline_cls.save_lora_weights(
        str(out), transformer_lora_layers=state, weight_name=weight_name,
        transformer_lora_adapter_metadata=config.to_dict() if with_metadata else None,
    )
    return out / weight_name


# diffusers LTX-2 module names -> Lightricks' (ltx-core) names, the inverse of diffusers'
# _convert_non_diffusers_ltx2_lora_to_diffusers for the modules a LoRA can target.
_LTX2_ORIGINAL_TOP = {"proj_in": "patchify_proj", "audio_proj_in": "audio_patchify_proj",
                      "time_embed": "adaln_single", "audio_time_embed": "audio_adaln_single",
                      "av_cross_attn_video_scale_shift": "av_ca_video_scale_shift_adaln_single",
                      "av_cross_attn_video_a2v_gate": "av_ca_a2v_gate_adaln_single",
                      "av_cross_attn_audio_scale_shift": "av_ca_audio_scale_shift_adaln_single",
                      "av_cross_attn_audio_v2a_gate": "av_ca_v2a_gate_adaln_single",
                      "prompt_adaln": "prompt_adaln_single", "audio_prompt_adaln": "audio_prompt_adaln_single"}


def rewrite_ltx2_original(peft_file: Path, out: Path) -> Path:
    """The same adapter as Lightricks' LoRAs name it: `diffusion_model.<ltx-core module>.lora_A.weight`, no metadata
    (so write the PEFT file with alpha = rank for the two to be the same adapter)."""
    from safetensors.torch import load_file, save_file

    renamed = {}
    for key, tensor in load_file(str(peft_file)).items():
        head, _, rest = key.removeprefix("transformer.").partition(".")
        renamed["diffusion_model." + ".".join((_LTX2_ORIGINAL_TOP.get(head, head), rest))] = tensor
    save_file(renamed, str(out))
    return out
