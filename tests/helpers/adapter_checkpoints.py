"""Tiny random diffusers pipelines that no native recipe claims, saved with `save_pretrained` (adapter tests).

Six shapes: CogVideoX (text- and image-to-video) and Mochi (text-to-video, T5 text), Qwen-Image (text-to-image, Qwen2.5-VL text),
AudioLDM (text-to-audio, CLAP text, HiFi-GAN vocoder; it has only the old `callback`/`callback_steps` hook) and
the Helios pyramid and distilled pyramid (chunked video whose frame rule is the pipeline's own); and
LDMTextToImagePipeline, whose call takes no step hook.
Each runs in well under a second on a CPU at the sizes the tests use. Tokenizers are trained offline.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch

from tests.helpers.flux2_checkpoints import train_qwen_tokenizer
from vidloom.demo.tokenizer import train_t5_tokenizer

T5_HIDDEN = 16


def _t5_encoder(vocab_size: int) -> Any:
    from transformers import T5Config, T5EncoderModel

    return T5EncoderModel(T5Config(vocab_size=vocab_size, d_model=T5_HIDDEN, d_kv=8, d_ff=32, num_layers=1,
                                   num_heads=2, relative_attention_num_buckets=8))


def _scale(module: torch.nn.Module, factor: float) -> None:
    """Random inits barely react to the conditioning; larger weights make a wrong input move the output."""
    with torch.no_grad():
        for p in module.parameters():
            p.mul_(factor)


COGVIDEOX_DIT = dict(
    num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4, time_embed_dim=8,
    text_embed_dim=T5_HIDDEN, num_layers=1, sample_width=8, sample_height=8, sample_frames=5, patch_size=2,
    temporal_compression_ratio=2, max_text_seq_length=226)


def build_cogvideox() -> Any:
    from diffusers import AutoencoderKLCogVideoX, CogVideoXDDIMScheduler, CogVideoXPipeline, CogVideoXTransformer3DModel

    tokenizer = train_t5_tokenizer()
    transformer = CogVideoXTransformer3DModel(**COGVIDEOX_DIT)
    vae = AutoencoderKLCogVideoX(
        down_block_types=("CogVideoXDownBlock3D",) * 2, up_block_types=("CogVideoXUpBlock3D",) * 2,
        block_out_channels=(8, 8), latent_channels=4, layers_per_block=1, norm_num_groups=2,
        temporal_compression_ratio=2)  # two levels: the VAE halves time once
    return CogVideoXPipeline(tokenizer=tokenizer, text_encoder=_t5_encoder(len(tokenizer)), vae=vae,
                             transformer=transformer, scheduler=CogVideoXDDIMScheduler())


def build_cogvideox_i2v() -> Any:
    """CogVideoX image-to-video: the text-to-video parts, with a transformer that also reads the image latents."""
    from diffusers import CogVideoXImageToVideoPipeline, CogVideoXTransformer3DModel

    t2v = build_cogvideox()
    transformer = CogVideoXTransformer3DModel(**{**COGVIDEOX_DIT, "in_channels": 8})  # + the image's 4 channels
    return CogVideoXImageToVideoPipeline(tokenizer=t2v.tokenizer, text_encoder=t2v.text_encoder, vae=t2v.vae,
                                         transformer=transformer, scheduler=t2v.scheduler)


def build_mochi() -> Any:
    from diffusers import AutoencoderKLMochi, FlowMatchEulerDiscreteScheduler, MochiPipeline, MochiTransformer3DModel

    tokenizer = train_t5_tokenizer()
    transformer = MochiTransformer3DModel(
        patch_size=2, num_attention_heads=2, attention_head_dim=8, num_layers=1, pooled_projection_dim=16,
        in_channels=12, text_embed_dim=T5_HIDDEN, time_embed_dim=4, max_sequence_length=16)
    vae = AutoencoderKLMochi(
        latent_channels=12, out_channels=3, encoder_block_out_channels=(32, 32, 32, 32),
        decoder_block_out_channels=(32, 32, 32, 32), layers_per_block=(1, 1, 1, 1, 1))
    return MochiPipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae,
                         text_encoder=_t5_encoder(len(tokenizer)), tokenizer=tokenizer, transformer=transformer)


def build_qwen_image() -> Any:
    from diffusers import AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImagePipeline
    from diffusers import QwenImageTransformer2DModel
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    tokenizer = train_qwen_tokenizer()
    config = Qwen2_5_VLConfig(
        text_config=dict(hidden_size=16, intermediate_size=16, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=2, vocab_size=len(tokenizer), rope_parameters={
                             "rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [1, 1, 2]}),
        vision_config=dict(depth=1, hidden_size=16, intermediate_size=16, num_heads=2, out_hidden_size=16),
        vocab_size=len(tokenizer), hidden_size=16)
    text_encoder = Qwen2_5_VLForConditionalGeneration(config)
    transformer = QwenImageTransformer2DModel(
        patch_size=2, in_channels=16, out_channels=4, num_layers=1, attention_head_dim=16, num_attention_heads=2,
        joint_attention_dim=16, guidance_embeds=False, axes_dims_rope=(8, 4, 4))
    vae = AutoencoderKLQwenImage(base_dim=8, z_dim=4, dim_mult=[1, 2, 4], num_res_blocks=1,
                                 temperal_downsample=[False, True], latents_mean=[0.0] * 4, latents_std=[1.0] * 4)
    scheduler = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, base_shift=0.5, max_shift=0.9,
                                                base_image_seq_len=16, max_image_seq_len=256)
    return QwenImagePipeline(transformer=transformer, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer,
                             scheduler=scheduler)


def _helios_pyramid(scheduler: str, **flags: Any) -> Any:
    """The Helios pyramid (the base HeliosPipeline is native) on Wan's tiny VAE and UMT5: a 2-block transformer,
    2x2 patches. gamma 0.25: the schedulers' default 1/3 makes the pyramid's block-noise covariance singular (its
    Cholesky fails), so tiny pipelines use another."""
    import diffusers
    from tests.helpers.wan_checkpoints import TINY_A, reference_parts

    transformer = diffusers.HeliosTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4,
        text_dim=32, freq_dim=16, ffn_dim=32, num_layers=2, rope_dim=(4, 4, 4))
    return diffusers.HeliosPyramidPipeline(**reference_parts(TINY_A, 0), transformer=transformer,
                                           scheduler=getattr(diffusers, scheduler)(gamma=0.25), **flags)


def build_ldm_text_to_image() -> Any:
    """LDMTextToImagePipeline: its call takes no step hook (the adapter runs it as one opaque step)."""
    from diffusers import AutoencoderKL, DDIMScheduler, LDMTextToImagePipeline, UNet2DConditionModel
    from diffusers.pipelines.latent_diffusion.pipeline_latent_diffusion import LDMBertConfig, LDMBertModel

    tokenizer = train_t5_tokenizer()
    bert = LDMBertModel(LDMBertConfig(vocab_size=len(tokenizer), max_position_embeddings=77, encoder_layers=1,
                                      encoder_ffn_dim=16, encoder_attention_heads=2, head_dim=8, d_model=16))
    unet = UNet2DConditionModel(
        block_out_channels=(8, 16), layers_per_block=1, sample_size=8, in_channels=4, out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"), up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=16, norm_num_groups=4)
    vae = AutoencoderKL(block_out_channels=(8, 16), latent_channels=4, down_block_types=("DownEncoderBlock2D",) * 2,
                        up_block_types=("UpDecoderBlock2D",) * 2, norm_num_groups=4)
    return LDMTextToImagePipeline(vqvae=vae, bert=bert, tokenizer=tokenizer, unet=unet, scheduler=DDIMScheduler())


def build_audioldm() -> Any:
    from diffusers import AudioLDMPipeline, AutoencoderKL, DDIMScheduler, UNet2DConditionModel
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import (ClapTextConfig, ClapTextModelWithProjection, RobertaTokenizerFast, SpeechT5HifiGan,
                              SpeechT5HifiGanConfig)

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    tok.train_from_iterator(_CORPUS, trainers.BpeTrainer(vocab_size=300, special_tokens=specials,
                                                          initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.post_processor = processors.RobertaProcessing(("</s>", tok.token_to_id("</s>")), ("<s>", tok.token_to_id("<s>")))
    tokenizer = RobertaTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                     unk_token="<unk>", mask_token="<mask>", model_max_length=77)
    text_encoder = ClapTextModelWithProjection(ClapTextConfig(
        vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16,
        projection_dim=16, max_position_embeddings=80))
    unet = UNet2DConditionModel(
        block_out_channels=(8, 16), layers_per_block=1, sample_size=8, in_channels=4, out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"), up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=(8, 16), class_embed_type="simple_projection", projection_class_embeddings_input_dim=16,
        class_embeddings_concat=True, norm_num_groups=4)
    vae = AutoencoderKL(block_out_channels=(8, 16), in_channels=1, out_channels=1, latent_channels=4,
                        down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                        norm_num_groups=4)
    vocoder = SpeechT5HifiGan(SpeechT5HifiGanConfig(
        model_in_dim=8, sampling_rate=16000, upsample_initial_channel=16, upsample_rates=[8, 8],
        upsample_kernel_sizes=[16, 16], resblock_kernel_sizes=[3, 7], resblock_dilation_sizes=[[1, 3, 5], [1, 3, 5]],
        normalize_before=False))
    scheduler = DDIMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", clip_sample=False)
    return AudioLDMPipeline(vae=vae, text_encoder=text_encoder, tokenizer=tokenizer, unet=unet, scheduler=scheduler,
                            vocoder=vocoder)


_CORPUS = [
    "a dog barks in the distance while rain falls", "techno music with a heavy bass line",
    "birds sing in a forest at dawn", "a crowd applauds after a speech", "waves on a pebble beach",
]

BUILDERS: dict[str, Callable[[], Any]] = {
    "cogvideox": build_cogvideox,
    "cogvideox-i2v": build_cogvideox_i2v,
    "mochi": build_mochi,
    "qwen-image": build_qwen_image,
    "audioldm": build_audioldm,
    "ldm": build_ldm_text_to_image,
    # The pyramid with CFG-Zero* (Helios-Mid's flags) and the distilled one (DMD scheduler; model_index.json
    # then holds `is_distilled: true`, a config value beside the components).
    "helios-pyramid": lambda: _helios_pyramid("HeliosScheduler", is_cfg_zero_star=True),
    "helios-distilled": lambda: _helios_pyramid("HeliosDMDScheduler", is_distilled=True),
}


def write_tiny_pipeline(folder: Path, kind: str, seed: int = 0) -> Path:
    """Build `kind` (a BUILDERS key) with seeded random weights and save it with the pipeline's save_pretrained."""
    torch.manual_seed(seed)
    pipe = BUILDERS[kind]()
    pipe.save_pretrained(str(folder))
    return folder


def reference_output(folder: Path, prompt: str, seed: int, **kwargs: Any) -> Any:
    """The pipeline called directly, as diffusers' examples call it (CPU generator), numpy output: uint8 frames
    [F, H, W, 3] (an image: one frame), or the waveform [channels, samples] of an audio pipeline."""
    import numpy as np
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(str(folder))
    pipe.set_progress_bar_config(disable=True)
    out = pipe(prompt=prompt, generator=torch.Generator("cpu").manual_seed(seed), output_type="np", **kwargs)
    if hasattr(out, "audios"):
        audio = np.asarray(out.audios, dtype=np.float32)[0]
        return audio[None] if audio.ndim == 1 else audio
    frames = out.frames[0] if hasattr(out, "frames") else out.images[:1]
    return (np.clip(np.asarray(frames, dtype=np.float32), 0.0, 1.0) * 255.0).round().astype(np.uint8)
