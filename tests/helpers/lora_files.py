"""Random LoRA files written by peft + diffusers' save_lora_weights on a tiny checkpoint's transformer.

PEFT initialises lora_B to zero (an adapter that changes nothing, so parity would pass with LoRA broken);
both factors are re-drawn here with a std large enough that the adapter moves the frames by many uint8 levels.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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


# The adapter and the small request the Wan LoRA serving tests share (per-request adapters, compile isolation).
WAN_LORA = LoRASpec(rank=4, alpha=4, targets=("to_q", "to_v", "ffn.net.0.proj"), seed=9)
WAN_LORA_REQUEST = dict(height=32, width=32, num_frames=5, num_inference_steps=2, guidance_scale=4.0, seed=3,
                        negative_prompt="blurred")


def add_random_adapter(model: torch.nn.Module, spec: LoRASpec) -> Any:
    """PEFT adapter "default" on `model` (rank, alpha, targets, per-module alpha from `spec`), its A and B factors
    drawn from N(0, spec.std) with spec.seed; returns its LoraConfig."""
    from peft import LoraConfig

    from peft import inject_adapter_in_model

    config = LoraConfig(r=spec.rank, lora_alpha=spec.alpha,
                        target_modules=spec.targets if isinstance(spec.targets, str) else list(spec.targets),
                        alpha_pattern=dict(spec.alpha_pattern), init_lora_weights=True)
    if hasattr(model, "add_adapter"):  # diffusers' PeftAdapterMixin
        model.add_adapter(config, adapter_name="default")
    else:  # a model diffusers gives no LoRA loader (Stable Audio's DiT): PEFT itself
        inject_adapter_in_model(config, model, adapter_name="default")
    g = torch.Generator().manual_seed(spec.seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_A." in name or ".lora_B." in name:
                param.copy_(torch.randn(param.shape, generator=g) * spec.std)
    return config


def write_lora(checkpoint: Path, pipeline: str, spec: LoRASpec, out: Path, with_metadata: bool = True) -> Path:
    """Write `out/<pipeline>-<seed>.safetensors`: a random LoRA on `checkpoint`'s transformer."""
    import diffusers
    from peft.utils import get_peft_model_state_dict

    pipeline_cls = getattr(diffusers, pipeline)
    transformer_cls = {"WanPipeline": diffusers.WanTransformer3DModel,
                       "Flux2KleinPipeline": diffusers.Flux2Transformer2DModel,
                       "AnyFlowFARPipeline": diffusers.AnyFlowFARTransformer3DModel,
                       "LTX2Pipeline": diffusers.LTX2VideoTransformer3DModel,
                       "QwenImagePipeline": diffusers.QwenImageTransformer2DModel,
                       "HeliosPipeline": diffusers.HeliosTransformer3DModel}[pipeline]
    transformer = transformer_cls.from_pretrained(str(checkpoint / "transformer"), torch_dtype=torch.float32)
    config = add_random_adapter(transformer, spec)
    state = get_peft_model_state_dict(transformer, adapter_name="default")
    weight_name = f"{pipeline}-{spec.seed}.safetensors"
    pipeline_cls.save_lora_weights(
        str(out), transformer_lora_layers=state, weight_name=weight_name,
        transformer_lora_adapter_metadata=config.to_dict() if with_metadata else None,
    )
    return out / weight_name


def write_peft_lora(model: torch.nn.Module, spec: LoRASpec, out: Path, name: str) -> Path:
    """`out/<name>.safetensors`: a random PEFT adapter on `model` (left injected, so it is the reference too), laid out
    as diffusers' save_lora_weights lays a transformer LoRA out (`transformer.<module>.lora_A.weight`, the alpha
    packed in `lora_adapter_metadata`), for a pipeline diffusers gives no LoRA loader."""
    import json

    from peft.utils import get_peft_model_state_dict
    from safetensors.torch import save_file

    config = add_random_adapter(model, spec)
    state = {f"transformer.{key}": t.contiguous() for key, t in get_peft_model_state_dict(model, adapter_name="default").items()}
    packed = {"transformer.r": config.r, "transformer.lora_alpha": config.lora_alpha,
              "transformer.alpha_pattern": dict(config.alpha_pattern)}
    save_file(state, str(out / f"{name}.safetensors"), metadata={"lora_adapter_metadata": json.dumps(packed)})
    return out / f"{name}.safetensors"


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


# diffusers Wan module names -> the Wan repo's, the inverse of diffusers' _convert_non_diffusers_wan_lora_to_diffusers.
_WAN_ORIGINAL = (("attn1.to_out.0", "self_attn.o"), ("attn2.to_out.0", "cross_attn.o"),
                 ("attn2.add_k_proj", "cross_attn.k_img"), ("attn2.add_v_proj", "cross_attn.v_img"),
                 ("attn1.to_", "self_attn."), ("attn2.to_", "cross_attn."),
                 ("ffn.net.0.proj", "ffn.0"), ("ffn.net.2", "ffn.2"), ("proj_out", "head.head"),
                 ("condition_embedder.time_proj", "time_projection.1"),
                 ("condition_embedder.text_embedder.linear_1", "text_embedding.0"),
                 ("condition_embedder.text_embedder.linear_2", "text_embedding.2"),
                 ("condition_embedder.time_embedder.linear_1", "time_embedding.0"),
                 ("condition_embedder.time_embedder.linear_2", "time_embedding.2"))


def _peft_modules(peft_file: Path) -> tuple[dict, dict]:
    """{module: {"A": down, "B": up}} of a diffusers LoRA file, and its per-module alpha from the metadata."""
    import json

    from safetensors import safe_open

    modules: dict = {}
    with safe_open(str(peft_file), framework="pt") as handle:
        raw = (handle.metadata() or {}).get("lora_adapter_metadata")
        for key in handle.keys():  # noqa: SIM118
            module, factor = key.removeprefix("transformer.").rsplit(".lora_", 1)
            modules.setdefault(module, {})[factor[0]] = handle.get_tensor(key)
    config = json.loads(raw) if raw else {}
    alpha = config.get("transformer.lora_alpha")
    return modules, {m: alpha for m in modules} if alpha is not None else {}


def rewrite_wan_community(peft_file: Path, out: Path, musubi: bool = False) -> Path:
    """The same adapter in the Wan repo's names with lora_down / lora_up and `.alpha` keys (ComfyUI and most
    trainers), or flattened as musubi-tuner writes it (`lora_unet_blocks_0_self_attn_q.lora_down.weight`)."""
    from safetensors.torch import save_file

    modules, alphas = _peft_modules(peft_file)
    written = {}
    for module, factors in modules.items():
        name = module
        for ours, theirs in _WAN_ORIGINAL:
            name = name.replace(ours, theirs)
        name = "lora_unet_" + name.replace(".", "_") if musubi else "diffusion_model." + name
        written[f"{name}.lora_down.weight"] = factors["A"]
        written[f"{name}.lora_up.weight"] = factors["B"]
        if module in alphas:
            written[f"{name}.alpha"] = torch.tensor(float(alphas[module]))
    save_file(written, str(out))
    return out


_FLUX2_AITOOLKIT = (("x_embedder", "img_in"), ("context_embedder", "txt_in"), ("proj_out", "final_layer.linear"),
                    ("single_transformer_blocks.", "single_blocks."), ("attn.to_qkv_mlp_proj", "linear1"),
                    ("transformer_blocks.", "double_blocks."), ("attn.to_out.0", "img_attn.proj"),
                    ("attn.to_add_out", "txt_attn.proj"), ("ff.linear_in", "img_mlp.0"),
                    ("ff.linear_out", "img_mlp.2"), ("ff_context.linear_in", "txt_mlp.0"),
                    ("ff_context.linear_out", "txt_mlp.2"), ("attn.to_out", "linear2"))
_FLUX2_FUSED = {"img_attn.qkv": ("attn.to_q", "attn.to_k", "attn.to_v"),
                "txt_attn.qkv": ("attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj")}


def tie_and_rewrite_flux2_aitoolkit(peft_file: Path, tied: Path, out: Path) -> tuple[Path, Path]:
    """ai-toolkit trains one LoRA on each fused qkv linear: write `tied`, the PEFT file with to_k / to_v (and the
    text stream's) down factors set to to_q's (one fused adapter, split), and `out`, the same adapter as ai-toolkit
    names it (`diffusion_model.double_blocks.N.img_attn.qkv.lora_A.weight`, B stacked). No alpha: alpha = rank."""
    from safetensors.torch import save_file

    modules, _ = _peft_modules(peft_file)
    written, tied_state = {}, {}
    for fused, (q, k, v) in _FLUX2_FUSED.items():
        for module in [m for m in modules if m.endswith("." + q)]:
            block = module[: -len(q) - 1]
            group = [modules.pop(f"{block}.{name}") for name in (q, k, v)]
            for name, factors in zip((q, k, v), group):
                tied_state[f"transformer.{block}.{name}.lora_A.weight"] = group[0]["A"].clone()
                tied_state[f"transformer.{block}.{name}.lora_B.weight"] = factors["B"]
            original = "diffusion_model." + block.replace("transformer_blocks.", "double_blocks.") + "." + fused
            written[f"{original}.lora_A.weight"] = group[0]["A"]
            written[f"{original}.lora_B.weight"] = torch.cat([f["B"] for f in group])
    for module, factors in modules.items():
        tied_state[f"transformer.{module}.lora_A.weight"] = factors["A"]
        tied_state[f"transformer.{module}.lora_B.weight"] = factors["B"]
        name = module
        for ours, theirs in _FLUX2_AITOOLKIT:
            name = name.replace(ours, theirs)
        written[f"diffusion_model.{name}.lora_A.weight"] = factors["A"]
        written[f"diffusion_model.{name}.lora_B.weight"] = factors["B"]
    save_file(tied_state, str(tied))
    save_file(written, str(out))
    return tied, out


def rewrite_flux2_kohya(peft_file: Path, out: Path) -> Path:
    """The same adapter as Kohya's sd-scripts names it (`lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight`,
    `.alpha` per module): each q/k/v triple becomes one fused qkv LoRA of rank 3r, its down factors stacked and its
    up factor block-diagonal (the split-qkv layout diffusers' converter detects as "sparse"), alpha scaled by 3 so
    alpha / rank is unchanged. The inverse of diffusers' _convert_kohya_flux2_lora_to_diffusers."""
    from safetensors.torch import save_file

    modules, alphas = _peft_modules(peft_file)
    written = {}
    for fused, (q, k, v) in _FLUX2_FUSED.items():
        for module in [m for m in modules if m.endswith("." + q)]:
            block = module[: -len(q) - 1]
            group = [modules.pop(f"{block}.{name}") for name in (q, k, v)]
            alpha = alphas.get(module, group[0]["A"].shape[0])
            name = "lora_unet_" + (block.replace("transformer_blocks.", "double_blocks.") + "." + fused).replace(".", "_")
            written[f"{name}.lora_down.weight"] = torch.cat([f["A"] for f in group])
            written[f"{name}.lora_up.weight"] = torch.block_diag(*[f["B"] for f in group])
            written[f"{name}.alpha"] = torch.tensor(3.0 * alpha)
    for module, factors in modules.items():
        name = module
        for ours, theirs in _FLUX2_AITOOLKIT:
            name = name.replace(ours, theirs)
        name = "lora_unet_" + name.replace(".", "_")
        written[f"{name}.lora_down.weight"] = factors["A"]
        written[f"{name}.lora_up.weight"] = factors["B"]
        written[f"{name}.alpha"] = torch.tensor(float(alphas.get(module, factors["A"].shape[0])))
    save_file(written, str(out))
    return out


def write_ltx2_lora_with_connectors(checkpoint: Path, transformer_spec: LoRASpec, connectors_spec: LoRASpec,
                                    out: Path) -> Path:
    """One LTX-2 adapter file on the transformer and the text connectors (`connectors.` keys), each with its own
    LoraConfig in the metadata, as diffusers' LTX2LoraLoaderMixin reads it (save_lora_weights writes only the
    transformer, so the two parts go through the pipeline's own _save_lora_weights)."""
    import diffusers
    from diffusers.pipelines.ltx2.connectors import LTX2TextConnectors
    from peft.utils import get_peft_model_state_dict

    layers, metadata = {}, {}
    for name, cls, spec in (("transformer", diffusers.LTX2VideoTransformer3DModel, transformer_spec),
                            ("connectors", LTX2TextConnectors, connectors_spec)):
        model = cls.from_pretrained(str(checkpoint / name), torch_dtype=torch.float32)
        config = add_random_adapter(model, spec)
        layers[name] = get_peft_model_state_dict(model, adapter_name="default")
        metadata[name] = config.to_dict()
    weight_name = f"LTX2Pipeline-connectors-{connectors_spec.seed}.safetensors"
    diffusers.LTX2Pipeline._save_lora_weights(save_directory=str(out), lora_layers=layers, lora_metadata=metadata,
                                              weight_name=weight_name)
    return out / weight_name
