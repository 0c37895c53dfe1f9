"""A second tiny random QwenImagePipeline (the first: adapter_checkpoints.build_qwen_image), built by diffusers and
transformers with other layer counts, heads, widths, VAE depth and Qwen-Image's real scheduler config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tests.helpers.flux2_checkpoints import train_qwen_tokenizer

# Qwen/Qwen-Image's scheduler_config.json: dynamic exponential shift, stretched to a terminal sigma of 0.02.
QWEN_IMAGE_SCHEDULER = dict(use_dynamic_shifting=True, base_shift=0.5, max_shift=0.9, base_image_seq_len=256,
                            max_image_seq_len=8192, shift_terminal=0.02, time_shift_type="exponential")


def text_encoder(vocab_size: int, hidden: int, layers: int, heads: int, kv_heads: int, **token_ids: int) -> Any:
    """A random Qwen2.5-VL (one-layer vision tower) with loud embeddings, so the prompt moves the image."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    config = Qwen2_5_VLConfig(
        text_config=dict(hidden_size=hidden, intermediate_size=32, num_hidden_layers=layers, num_attention_heads=heads,
                         num_key_value_heads=kv_heads, vocab_size=vocab_size, rope_parameters={
                             "rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [1, 1, 2]}),
        vision_config=dict(depth=1, hidden_size=16, intermediate_size=16, num_heads=2, out_hidden_size=hidden),
        vocab_size=vocab_size, hidden_size=hidden, **token_ids)
    model = Qwen2_5_VLForConditionalGeneration(config)
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(10.0)
    return model


def build_qwen_image_wide(heads: int = 3, axes: tuple[int, int, int] = (2, 4, 2)) -> Any:
    """Three blocks of width 24 in `heads` heads (rotary `axes` sum to the head width)."""
    from diffusers import AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImagePipeline
    from diffusers import QwenImageTransformer2DModel

    tokenizer = train_qwen_tokenizer()
    encoder = text_encoder(len(tokenizer), 24, 3, 3, 1)
    transformer = QwenImageTransformer2DModel(
        patch_size=2, in_channels=24, out_channels=6, num_layers=3, attention_head_dim=24 // heads,
        num_attention_heads=heads, joint_attention_dim=24, guidance_embeds=False, axes_dims_rope=axes)
    g = torch.Generator().manual_seed(7)
    vae = AutoencoderKLQwenImage(base_dim=8, z_dim=6, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
                                 temperal_downsample=[False, True, True],
                                 latents_mean=(0.3 * torch.randn(6, generator=g)).tolist(),
                                 latents_std=(torch.rand(6, generator=g) + 0.5).tolist())
    scheduler = FlowMatchEulerDiscreteScheduler(**QWEN_IMAGE_SCHEDULER)
    return QwenImagePipeline(transformer=transformer, vae=vae, text_encoder=encoder, tokenizer=tokenizer,
                             scheduler=scheduler)


def write_qwen_image_wide(folder: Path, seed: int = 1, heads: int = 3,
                          axes: tuple[int, int, int] = (2, 4, 2)) -> Path:
    torch.manual_seed(seed)
    build_qwen_image_wide(heads, axes).save_pretrained(str(folder))
    return folder


# The vision tokens the edit template and Qwen2-VL's processor use, beside the text specials.
VISION_SPECIALS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")


def edit_processor(folder: Path) -> Any:
    """Qwen2VLProcessor over the folder's tokenizer and a PIL image processor, for the reference pipeline.

    transformers refuses to build it without a video processor, which needs torchvision (not installable beside
    our torch); the check is skipped here only, and the processor runs as transformers wrote it."""
    from unittest import mock

    from transformers import AutoTokenizer, Qwen2VLImageProcessorPil, Qwen2VLProcessor
    from transformers.processing_utils import ProcessorMixin

    images = Qwen2VLImageProcessorPil.from_pretrained(str(folder / "processor"))
    tokenizer = AutoTokenizer.from_pretrained(str(folder / "tokenizer"))
    with mock.patch.object(ProcessorMixin, "check_argument_for_proper_class", lambda self, name, arg: None):
        return Qwen2VLProcessor(image_processor=images, tokenizer=tokenizer, video_processor=None)


def write_qwen_image_edit(folder: Path, seed: int = 2, pipeline: str = "QwenImageEditPipeline",
                          zero_cond_t: bool = False) -> Path:
    """A tiny `pipeline` (QwenImageEditPipeline or QwenImageEditPlusPipeline) folder: the T2I tiny shapes plus a
    vision tower and its processor config; `zero_cond_t`: Qwen-Image-Edit-2511's transformer switch."""
    from diffusers import AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImageTransformer2DModel
    from transformers import Qwen2VLImageProcessorPil

    from tests.helpers.flux2_checkpoints import SPECIALS
    from vidloom.demo.cache import write_json
    from vidloom.demo.writer import model_index

    torch.manual_seed(seed)
    tokenizer = train_qwen_tokenizer(specials=(*SPECIALS, *VISION_SPECIALS))
    ids = tokenizer.convert_tokens_to_ids
    encoder = text_encoder(len(tokenizer), 16, 2, 2, 2, image_token_id=ids("<|image_pad|>"),
                           video_token_id=ids("<|video_pad|>"), vision_start_token_id=ids("<|vision_start|>"),
                           vision_end_token_id=ids("<|vision_end|>"))
    transformer = QwenImageTransformer2DModel(
        patch_size=2, in_channels=16, out_channels=4, num_layers=2, attention_head_dim=16, num_attention_heads=2,
        joint_attention_dim=16, guidance_embeds=False, axes_dims_rope=(8, 4, 4), zero_cond_t=zero_cond_t)
    with torch.no_grad():  # louder image-side attention: the reference's tokens visibly move the target's
        for name, param in transformer.named_parameters():
            if any(part in name for part in ("attn.to_k.", "attn.to_v.", "attn.to_out.0.", "img_in.")):
                param.mul_(3.0)
    # Three 2x downsamples: the ~1024^2 reference becomes 128^2 latents, 64^2 = 4096 tokens.
    vae = AutoencoderKLQwenImage(base_dim=8, z_dim=4, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
                                 temperal_downsample=[False, True, True], latents_mean=[0.1, -0.2, 0.0, 0.3],
                                 latents_std=[1.5, 0.8, 1.0, 1.2])
    scheduler = FlowMatchEulerDiscreteScheduler(**QWEN_IMAGE_SCHEDULER)
    for name, module in (("transformer", transformer), ("vae", vae), ("text_encoder", encoder),
                         ("scheduler", scheduler), ("tokenizer", tokenizer)):
        module.save_pretrained(str(folder / name))
    images = Qwen2VLImageProcessorPil(min_pixels=56 * 56, max_pixels=28 * 28 * 16, patch_size=14,
                                      temporal_patch_size=2, merge_size=2)
    images.save_pretrained(str(folder / "processor"))
    write_json(folder / "model_index.json", model_index(
        pipeline, scheduler="diffusers:FlowMatchEulerDiscreteScheduler",
        text_encoder="transformers:Qwen2_5_VLForConditionalGeneration", tokenizer="transformers:Qwen2TokenizerFast",
        processor="transformers:Qwen2VLProcessor", transformer="diffusers:QwenImageTransformer2DModel",
        vae="diffusers:AutoencoderKLQwenImage"))
    return folder
