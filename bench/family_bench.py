"""The side-by-side report's workloads: one mid-size random-weight checkpoint per family, the request vidloom
runs on it, and the same request spelled for the family's reference pipeline.

Mid-size (hundreds of wide channels, hundreds to a few thousand tokens) rather than the tiny demos, where
process start, text encoding and Python overhead hide the denoiser; sized so the whole report takes tens
of minutes on 2 CPU cores (one run per setting took about 40 minutes here under a load average of 12-20).
The architectures are the ones the per-family benchmarks use (bench/checkpoints.py, wan22.py,
far_rollout.py, images_batch.py, ltx2.py, chat_decode.py); checkpoints are written once into bench/.cache/
under names of their own.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
for _path in (str(ROOT), str(ROOT / "bench")):  # run as `python bench/x.py` from anywhere
    if _path not in sys.path:
        sys.path.insert(0, _path)
PROMPT = "a red fox jumps over a frozen river"
NEGATIVE = "blurry, low quality"
SEED = 42
CHAT_STREAMS = 16
"""Concurrent chat requests: vidloom's continuous batching vs one left-padded `generate` batch."""
CHAT_TOKENS = 48
"""Greedy tokens per chat request (random weights may stop earlier; produced tokens are counted)."""
CHAT_PROMPTS = ("hello world", "tell me a story about robots", "what is in this picture?", "the quick brown fox",
                "cosmos predicts the future of the physical world", "1 2 3 4 5 6 7 8 9 0")


@dataclass(frozen=True)
class FamilyBench:
    """One family's row group: how to write its checkpoint and run one generation on either side."""

    name: str
    write: Callable[[Path], Any]
    """Writes the random-weight checkpoint into an empty folder."""
    pipeline: str
    """The reference: a diffusers pipeline class name, or "generate" (transformers, chat)."""
    request: dict[str, Any]
    """height, width, num_frames, steps, guidance (and family extras); recorded in the JSON."""
    reference_call: Callable[[Any, dict[str, Any], int], np.ndarray] | None = None
    """(pipeline, request, steps) -> frames [F, H, W, 3] in [0, 1] (audio: `unit_audio` of the waveform)."""
    load_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra from_pretrained arguments of the reference pipeline."""
    architecture: dict[str, Any] = field(default_factory=dict)
    """The denoiser's config, for the JSON."""
    folder: str = ""
    """Checkpoint folder name under bench/.cache/ (default: `name`); chat shares the generation checkpoint."""
    warmup_steps: int = 1
    """Steps of the untimed warm-up generation (LTX-2's schedule needs 2 to reach its shift_terminal)."""
    chat_reference: Callable[[Path, str], Any] | None = None
    """Chat rows: (folder, dtype) -> the transformers side's batch generate (bench/chat_streams.py)."""
    marker: str = "model_index.json"
    """A file every complete checkpoint folder has (a transformers folder's is config.json)."""
    output: str = "video"
    """The slot of vidloom's result compared with `reference_call`'s array: "video" frames, or the "audio"
    waveform (a request with `seconds` is text to audio)."""

    def checkpoint(self) -> Path:
        """The folder, written atomically on first use."""
        from checkpoints import cached

        return cached(self.folder or self.name, self.write, self.marker)

    def vidloom_request(self, steps: int) -> Any:
        from vidloom.core.request import GenerationRequest, Task

        r = self.request
        if self.output == "audio":  # an audio card refuses frame fields: the clip's length is its seconds
            return GenerationRequest(PROMPT, task=Task.T2A, negative_prompt=r.get("negative_prompt", NEGATIVE),
                                     num_inference_steps=steps, guidance_scale=r["guidance"], seed=SEED,
                                     seconds=r["seconds"])
        extra = {"fps": r["fps"]} if "fps" in r else {}
        return GenerationRequest(
            PROMPT, task=Task.T2I if r["num_frames"] == 1 else Task.T2V,
            negative_prompt=r.get("negative_prompt", NEGATIVE), height=r["height"], width=r["width"],
            num_frames=r["num_frames"], num_inference_steps=steps, guidance_scale=r["guidance"], seed=SEED, **extra)

    def vidloom_output(self, out: dict[str, Any]) -> np.ndarray:
        """The array of vidloom's result that `reference_call`'s is compared with (frames as they come: float in
        [0, 1], or uint8 from a CUDA device; audio through `unit_audio`, as the reference call maps its own)."""
        return unit_audio(out["audio"]) if self.output == "audio" else out[self.output]


def unit_audio(waveform: Any) -> np.ndarray:
    """A [-1, 1] waveform [channels, samples] as float32 in [0, 1] ((w + 1) / 2, not clipped), so the benchmarks'
    frame PSNR (peak 1, bench/report.py) reads it as a PSNR over the waveform's full-scale peak-to-peak range of 2:
    10 log10(4 / MSE of the waveform). Both sides map their waveform so before any comparison."""
    return (np.asarray(waveform, dtype=np.float32) + 1.0) / 2.0


def _generator() -> Any:
    import torch

    return torch.Generator("cpu").manual_seed(SEED)  # vidloom draws its noise the same way


def _call_wan(pipe: Any, r: dict[str, Any], steps: int) -> np.ndarray:
    return pipe(prompt=PROMPT, negative_prompt=r.get("negative_prompt", NEGATIVE), height=r["height"],
                width=r["width"], num_frames=r["num_frames"], num_inference_steps=steps,
                guidance_scale=r["guidance"], generator=_generator(), output_type="np").frames[0]


def _call_far(pipe: Any, r: dict[str, Any], steps: int) -> np.ndarray:
    from vidloom.families.wan_causal.loop import chunk_partition

    # The partition vidloom derives for this length (the pipeline needs it spelled out).
    partition = chunk_partition((r["num_frames"] - 1) // 4 + 1, tuple(pipe.transformer.config.chunk_partition))
    return pipe(prompt=PROMPT, negative_prompt=NEGATIVE, height=r["height"], width=r["width"],
                num_frames=r["num_frames"], num_inference_steps=steps, guidance_scale=r["guidance"],
                chunk_partition=list(partition), generator=_generator(), output_type="np",
                use_kv_cache=True).frames[0]


def _call_flux2(pipe: Any, r: dict[str, Any], steps: int) -> np.ndarray:
    out = pipe(prompt=PROMPT, height=r["height"], width=r["width"], num_inference_steps=steps,
               guidance_scale=r["guidance"], generator=_generator(), output_type="np")
    return np.asarray(out.images)  # [1, H, W, 3]: one frame, like vidloom's video slot


def _call_ltx2(pipe: Any, r: dict[str, Any], steps: int) -> np.ndarray:
    video, _audio = pipe(prompt=PROMPT, negative_prompt=NEGATIVE, height=r["height"], width=r["width"],
                         num_frames=r["num_frames"], frame_rate=float(r["fps"]), num_inference_steps=steps,
                         guidance_scale=r["guidance"], generator=_generator(), output_type="np", return_dict=False)
    return video[0]


def _call_cosmos3(pipe: Any, r: dict[str, Any], steps: int) -> np.ndarray:
    out = pipe(PROMPT, negative_prompt=NEGATIVE, num_frames=r["num_frames"], height=r["height"], width=r["width"],
               fps=r["fps"], num_inference_steps=steps, guidance_scale=r["guidance"], generator=_generator(),
               output_type="np", enable_safety_check=False)
    return np.asarray(out.video)


def _write_wan21(folder: Path) -> None:
    from checkpoints import SIZES

    from tests.helpers.wan_checkpoints import write_tiny_wan

    write_tiny_wan(folder, SIZES["mid"].spec)


def _write_ti2v(folder: Path) -> None:
    from wan22 import TI2V_MID

    from tests.helpers.wan22_checkpoints import write_tiny_ti2v

    write_tiny_ti2v(folder, TI2V_MID)


def _write_far(folder: Path) -> None:
    from far_rollout import MID

    from tests.helpers.far_checkpoints import write_tiny_far

    write_tiny_far(folder, MID)


def _write_flux2(folder: Path) -> None:
    from images_batch import SIZES

    from tests.helpers.flux2_checkpoints import write_tiny_flux2

    write_tiny_flux2(folder, SIZES["large"][0])


def _write_ltx2(folder: Path) -> None:
    from ltx2 import MID

    from tests.helpers.ltx2_checkpoints import write_tiny_ltx2

    write_tiny_ltx2(folder, MID, upsampler=False)


def _write_cosmos3(folder: Path) -> None:
    from chat_decode import SIZES

    from tests.helpers.cosmos3_checkpoints import write_tiny_cosmos3

    write_tiny_cosmos3(folder, SIZES["mid"])


def _call_hunyuan15(pipe: Any, r: dict[str, Any], steps: int) -> np.ndarray:
    from tests.helpers.hunyuan15_checkpoints import system_turn_tokens

    # The offline tokenizer's chat template: the system turn the reference drops (as the parity tests set it).
    pipe.prompt_template_encode_start_idx = system_turn_tokens(pipe.tokenizer)
    return pipe(prompt=PROMPT, negative_prompt=NEGATIVE, height=r["height"], width=r["width"],
                num_frames=r["num_frames"], num_inference_steps=steps, generator=_generator(),
                output_type="np").frames[0]  # guidance: the saved guider's (r["guidance"] is the same)


def _call_helios(pipe: Any, r: dict[str, Any], steps: int) -> np.ndarray:
    return _call_wan(pipe, r, steps)  # HeliosPipeline takes the same arguments


# HunyuanVideo-1.5 mid: 8 heads x 64, 6 dual-stream blocks, one refiner block, 1x1x1 patch, 16x VAE of 16 channels.
HUNYUAN15_MID = dict(in_channels=33, out_channels=16, num_attention_heads=8, attention_head_dim=64, num_layers=6,
                     num_refiner_layers=1, mlp_ratio=4.0, patch_size=1, patch_size_t=1, text_embed_dim=64,
                     text_embed_2_dim=32, image_embed_dim=12, rope_axes_dim=(16, 24, 24), target_size=64,
                     task_type="t2v")
HUNYUAN15_GUIDANCE = 6.0


def _write_hunyuan15(folder: Path) -> None:
    import torch
    from diffusers import (
        AutoencoderKLHunyuanVideo15, ClassifierFreeGuidance, FlowMatchEulerDiscreteScheduler,
        HunyuanVideo15Pipeline, HunyuanVideo15Transformer3DModel,
    )

    from tests.helpers.hunyuan15_checkpoints import perturb, text_encoders

    torch.manual_seed(0)
    transformer = HunyuanVideo15Transformer3DModel(**HUNYUAN15_MID).eval()
    perturb(transformer, 1)
    vae = AutoencoderKLHunyuanVideo15(latent_channels=16, block_out_channels=(16, 16, 32, 32, 32), layers_per_block=1,
                                      spatial_compression_ratio=16).eval()
    texts = text_encoders(HUNYUAN15_MID["text_embed_dim"], HUNYUAN15_MID["text_embed_2_dim"])
    HunyuanVideo15Pipeline(transformer=transformer, vae=vae, scheduler=FlowMatchEulerDiscreteScheduler(shift=5.0),
                           guider=ClassifierFreeGuidance(guidance_scale=HUNYUAN15_GUIDANCE),
                           **texts).save_pretrained(str(folder))


def _write_helios(folder: Path) -> None:
    from tests.helpers.helios_checkpoints import TinyHelios, helios_dit, write_tiny_helios
    from tests.helpers.wan_checkpoints import wan_vae

    # Helios mid: 8 heads x 64, FFN 1536, 6 layers (history amplified per head), a small Wan VAE, UniPC.
    dit = {**helios_dit(8, 64, 16, (16, 24, 24), is_amplify_history=True, history_scale_mode="per_head"),
           "ffn_dim": 1536, "num_layers": 6}
    write_tiny_helios(folder, TinyHelios("helios-mid", dit, wan_vae(base_dim=16, z_dim=16, dim_mult=[1, 2, 2, 2],
                                                                    num_res_blocks=1),
                                         dict(stages=1, scheduler_type="unipc", use_dynamic_shifting=True,
                                              time_shift_type="exponential")))


_WAN21_DIT = "Wan2.1 layout, 8 heads x 64, FFN 1536, 14 layers (bench/checkpoints.py mid)"
def _cosmos3_chat(folder: Path, dtype: str) -> Any:
    from chat_streams import cosmos3_reference

    return cosmos3_reference(folder, dtype)


FAMILIES: dict[str, FamilyBench] = {f.name: f for f in (
    FamilyBench("wan2.1-mid", _write_wan21, "WanPipeline",
                dict(height=256, width=256, num_frames=9, steps=6, guidance=5.0), _call_wan,
                architecture={"dit": _WAN21_DIT, "tokens": 3 * 16 * 16}),
    FamilyBench("wan2.2-ti2v-mid", _write_ti2v, "WanPipeline",
                dict(height=256, width=256, num_frames=9, steps=4, guidance=5.0, negative_prompt=""), _call_wan,
                architecture={"dit": "TI2V layout (48 latent channels, 16x VAE), 8 heads x 64, 10 layers "
                                     "(bench/wan22.py TI2V_MID)", "tokens": 3 * 8 * 8}),
    FamilyBench("far-mid", _write_far, "AnyFlowFARPipeline",
                dict(height=160, width=160, num_frames=29, steps=4, guidance=1.0), _call_far,
                architecture={"dit": "AnyFlow-FAR, 8 heads x 64, FFN 1536, 4 layers (bench/far_rollout.py MID)",
                              "tokens": 8 * 10 * 10}),
    FamilyBench("flux2-klein-mid", _write_flux2, "Flux2KleinPipeline",
                dict(height=256, width=256, num_frames=1, steps=4, guidance=1.0), _call_flux2,
                architecture={"dit": "Klein layout, 8 heads x 128, 4 double + 8 single blocks "
                                     "(bench/images_batch.py large)", "tokens": 16 * 16}),
    FamilyBench("ltx2-mid", _write_ltx2, "LTX2Pipeline",
                dict(height=256, width=256, num_frames=25, fps=24, steps=6, guidance=3.0), _call_ltx2, warmup_steps=2,
                architecture={"dit": "LTX-2 audio+video, 8 heads x 32, 8 layers (bench/ltx2.py MID)"}),
    FamilyBench("cosmos3-mid", _write_cosmos3, "Cosmos3OmniPipeline",
                dict(height=192, width=192, num_frames=17, fps=16, steps=6, guidance=4.0), _call_cosmos3,
                load_kwargs={"enable_safety_checker": False},
                architecture={"dit": "Cosmos3 Omni, hidden 512, 6 layers, GQA 8/2 (bench/chat_decode.py mid)"}),
    FamilyBench("cosmos3-chat-mid", _write_cosmos3, "generate",
                dict(streams=CHAT_STREAMS, max_tokens=CHAT_TOKENS, greedy=True),
                architecture={"dit": "the same Cosmos3 checkpoint's text backbone (bench/chat_decode.py mid)"},
                folder="cosmos3-mid", chat_reference=_cosmos3_chat),
    FamilyBench("hunyuan15-mid", _write_hunyuan15, "HunyuanVideo15Pipeline",
                dict(height=256, width=256, num_frames=9, steps=6, guidance=HUNYUAN15_GUIDANCE), _call_hunyuan15,
                architecture={"dit": "HunyuanVideo-1.5 layout, 8 heads x 64, 6 dual-stream blocks, 16x VAE",
                              "tokens": 3 * 16 * 16}),
    FamilyBench("helios-mid", _write_helios, "HeliosPipeline",
                dict(height=128, width=128, num_frames=65, steps=4, guidance=5.0), _call_helios,
                architecture={"dit": "Helios, 8 heads x 64, FFN 1536, 6 layers; two 33-frame chunks",
                              "tokens": 9 * 8 * 8}),
)}


# --- Qwen-Image (#38): a mid-size random QwenImagePipeline, true CFG as the pipeline runs it ---------------------
QWEN_IMAGE_MID = dict(heads=8, head_dim=64, layers=6, axes=(16, 24, 24), text_hidden=32, text_layers=4)
"""The transformer (dim 512), its rotary axes and the Qwen2.5-VL text width and depth (4 heads of 8: the tiny
encoder's mrope_section [1, 1, 2] covers a head's rotary half)."""


def _write_qwen_image(folder: Path) -> None:
    import torch
    from diffusers import AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImagePipeline
    from diffusers import QwenImageTransformer2DModel

    from tests.helpers.flux2_checkpoints import train_qwen_tokenizer
    from tests.helpers.qwen_image_checkpoints import QWEN_IMAGE_SCHEDULER, text_encoder

    m = QWEN_IMAGE_MID
    torch.manual_seed(SEED)
    tokenizer = train_qwen_tokenizer()
    encoder = text_encoder(len(tokenizer), m["text_hidden"], m["text_layers"], 4, 2)
    transformer = QwenImageTransformer2DModel(
        patch_size=2, in_channels=64, out_channels=16, num_layers=m["layers"], attention_head_dim=m["head_dim"],
        num_attention_heads=m["heads"], joint_attention_dim=m["text_hidden"], axes_dims_rope=m["axes"])
    vae = AutoencoderKLQwenImage(base_dim=32, z_dim=16, dim_mult=[1, 2, 2, 2], num_res_blocks=1,
                                 temperal_downsample=[False, True, True])
    QwenImagePipeline(transformer=transformer, vae=vae, text_encoder=encoder, tokenizer=tokenizer,
                      scheduler=FlowMatchEulerDiscreteScheduler(**QWEN_IMAGE_SCHEDULER)).save_pretrained(str(folder))


def _call_qwen_image(pipe: Any, r: dict[str, Any], steps: int) -> np.ndarray:
    out = pipe(prompt=PROMPT, negative_prompt=NEGATIVE, true_cfg_scale=r["guidance"], height=r["height"],
               width=r["width"], num_inference_steps=steps, generator=_generator(), output_type="np")
    return np.asarray(out.images)  # [1, H, W, 3]


FAMILIES["qwen-image-mid"] = FamilyBench(
    "qwen-image-mid", _write_qwen_image, "QwenImagePipeline",
    dict(height=256, width=256, num_frames=1, steps=4, guidance=4.0), _call_qwen_image,
    warmup_steps=2,  # the scheduler's shift_terminal stretch needs two steps
    architecture={"dit": "Qwen-Image MMDiT, 8 heads x 64, 6 dual-stream blocks, text 32 wide x 4 layers "
                         "(bench/family_bench.py QWEN_IMAGE_MID)", "tokens": 16 * 16})


# --- Qwen3-Omni (#38): chat through a mid-size random MoE thinker, 16 streams vs transformers' generate -----------
QWEN3_OMNI_MID = dict(
    hidden_size=512, intermediate_size=1024, num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=2,
    head_dim=64, num_experts=16, num_experts_per_tok=4, moe_intermediate_size=256, norm_topk_prob=True)
"""The thinker's text decoder (its towers stay the tests' tiny ones; chat here is text in, text out)."""


def _write_qwen3_omni(folder: Path) -> None:
    from tests.helpers.qwen3_omni_checkpoints import TinyThinker, mrope, write_tiny_thinker

    write_tiny_thinker(folder, TinyThinker("chat-mid", {**QWEN3_OMNI_MID,
                                                        "rope_parameters": mrope(1000000.0, [16, 8, 8])}), SEED)


def _qwen3_omni_chat(folder: Path, dtype: str) -> Any:
    from chat_streams import qwen3_omni_reference

    return qwen3_omni_reference(folder, dtype)


FAMILIES["qwen3-omni-chat-mid"] = FamilyBench(
    "qwen3-omni-chat-mid", _write_qwen3_omni, "generate", dict(streams=CHAT_STREAMS, max_tokens=CHAT_TOKENS, greedy=True),
    chat_reference=_qwen3_omni_chat, marker="config.json",
    architecture={"dit": "Qwen3-Omni MoE thinker, hidden 512, 6 layers, GQA 8/2, 16 experts top-4 "
                         "(bench/family_bench.py QWEN3_OMNI_MID)"})


# --- Stable Audio (#36): a mid-size random StableAudioPipeline, CFG batched as the pipeline runs it -------------
STABLE_AUDIO_MID = dict(
    transformer=dict(sample_size=256, in_channels=32, num_layers=6, attention_head_dim=64, num_attention_heads=8,
                     num_key_value_attention_heads=4, out_channels=32, cross_attention_dim=256, time_proj_dim=128,
                     global_states_input_dim=256, cross_attention_input_dim=128),
    vae=dict(encoder_hidden_size=64, downsampling_ratios=[2, 4, 8], channel_multiples=[1, 2, 4], decoder_channels=16,
             decoder_input_channels=32, audio_channels=2, sampling_rate=4096),
    projection=dict(text_encoder_dim=32, conditioning_dim=128, min_value=0, max_value=8))
"""The DiT (dim 512, GQA 8/4, 6 blocks over a 256-step latent window: 257 tokens with the global one), a stereo
Oobleck VAE of hop 64 at 4096 Hz (a 4 s window) and the duration conditioner up to 8 s; the T5 text encoder stays the
tests' tiny one. With the tests' writer's init (tests/helpers/stable_audio_checkpoints.py) the activations stay O(1),
far from float32 denormals (measured through 8 steps: each block's output has mean |x| 0.53-0.88, max 5.7) and the
waveform within [-1, 1] (-0.35 to 0.99, std 0.26). vidloom reads the Oobleck encoder's width as twice the latent
channels (the posterior's mean and scale), as in the released model (128 = 2 x 64)."""


def _write_stable_audio(folder: Path) -> None:
    from tests.helpers.stable_audio_checkpoints import TinyStableAudio, write_tiny_stable_audio

    write_tiny_stable_audio(folder, TinyStableAudio("stable-audio-mid", **STABLE_AUDIO_MID), seed=SEED)


def _call_stable_audio(pipe: Any, r: dict[str, Any], steps: int) -> np.ndarray:
    out = pipe(prompt=PROMPT, negative_prompt=r.get("negative_prompt", NEGATIVE), audio_start_in_s=0.0,
               audio_end_in_s=r["seconds"], num_inference_steps=steps, guidance_scale=r["guidance"],
               generator=_generator(), output_type="np")
    return unit_audio(out.audios[0])  # [channels, samples], vidloom's "audio" slot (vidloom_output maps it alike)


FAMILIES["stable-audio-mid"] = FamilyBench(
    "stable-audio-mid", _write_stable_audio, "StableAudioPipeline",
    dict(seconds=4.0, steps=8, guidance=7.0), _call_stable_audio, output="audio",  # guidance: the pipeline's default
    architecture={"dit": "Stable Audio DiT, 8 heads x 64 (GQA 8/4), 6 blocks, 256 latent steps; stereo Oobleck VAE, "
                         "hop 64 at 4096 Hz (bench/family_bench.py STABLE_AUDIO_MID)", "tokens": 1 + 256})
