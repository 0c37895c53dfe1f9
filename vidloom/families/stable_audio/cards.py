"""Cards for Stable Audio Open diffusers folders (text to audio: a waveform, no frames)."""

from __future__ import annotations

from pathlib import Path

from vidloom.core.capabilities import Capabilities
from vidloom.core.blocks import AUDIO_LENGTH
from vidloom.core.card import AudioSpec, BlockSpec, Geometry, LoopSpec, ModelCard, SamplingDefaults
from vidloom.core.card_kit import FamilyCards, component_table, refusals
from vidloom.core.request import Task
from vidloom.loading.diffusers_dir import DiffusersDir
from vidloom.families.stable_audio.projection import ProjectionConfig
from vidloom.families.stable_audio.transformer import StableAudioDiTConfig
from vidloom.families.stable_audio.vae import OobleckDecoderConfig

FAMILY = "stable-audio"
PIPELINE_CLASS = "StableAudioPipeline"
PROGRAM = "vidloom.families.stable_audio.program:build_program"
MEMORY_ESTIMATOR = "vidloom.families.stable_audio.memory:request_estimator"
SAMPLERS = ("cosine-dpmsolver++",)
# StableAudioPipeline's __call__ defaults: 100 steps, guidance 7.0, no negative prompt; a clip of the model's
# whole window (47.55 s for stabilityai/stable-audio-open-1.0) unless seconds is given.
DEFAULTS = SamplingDefaults(
    height=1, width=1, num_frames=1, fps=1, num_inference_steps=100, guidance_scale=7.0, flow_shift=1.0,
    sampler=SAMPLERS[0], negative_prompt="",
)
# Frame fields are refused on audio cards (core.request.FRAME_FIELDS); these only satisfy the shared checks.
NO_FRAMES = Geometry(spatial_multiple=1, temporal_factor=1)

CAPABILITIES = Capabilities(
    # step_cache, compile, fp8_weights: the DiT declares the staged denoiser and its blocks (loop.StableAudioNetwork);
    # every request runs the model's whole window, so one compiled shape serves all (per CFG batch size).
    # cuda_graphs: the per-request duration token is a graph input (loop.StableAudioNetwork.graph_split).
    # vae_tile: the Oobleck decoder in windows over time (tiling.decode_windows_1d; sizes in waveform samples).
    # batching: every request runs the one window, so steps stack; the duration tokens too (loop.StableAudioNetwork).
    # devices, cfg_parallel: [global token, latent steps] sharded as one padded stream (parallel.token_layout).
    frozenset({"prompt_cache_size", "cfg_mode", "step_cache", "compile", "fp8_weights", "cuda_graphs", "vae_tile",
               "batching", "devices", "cfg_parallel"}),
    refusals("kv_pool_tokens", "kv_session_ttl_s", "offload_idle_expert", "two_stage", "components",
             warmup_shapes="warmup shapes are video sizes (HxWxF); every audio request runs the model's one window",
             offload_text_encoder="the T5 encoder is small and stays resident",
             attention_backend="the DiT attends through PyTorch SDPA only",
             kv_cache_budget_bytes="an audio denoiser keeps no KV cache to budget",
             text_encoder_rank="the T5 encoder is small and stays resident on every rank (its memory estimate "
                               "reads the encoder's token length)"),
)
# The common request fields the program reads: the cosine DPM schedule has no shift, so flow_shift is refused
# rather than ignored. Frame fields stay listed: core.request refuses them on every audio card with its reason.
READS = frozenset({"negative_prompt", "num_inference_steps", "guidance_scale", "sampler", "step_cache_threshold",
                   "height", "width", "num_frames", "fps"})
CARDS = FamilyCards(FAMILY, PROGRAM, MEMORY_ESTIMATOR, CAPABILITIES)
CAPABILITY_ROWS = {FAMILY: CAPABILITIES}  # `vidloom models --capabilities`

# StableAudioPipeline.__init__ (diffusers 0.42): its components; model_index.json may hold nothing else.
INDEX_COMPONENTS = ("vae", "text_encoder", "projection_model", "tokenizer", "transformer", "scheduler")


def check_pipeline(ckpt: DiffusersDir) -> None:
    ckpt.expect_pipeline(PIPELINE_CLASS)
    ckpt.check_index(INDEX_COMPONENTS)


def audio_spec(ckpt: DiffusersDir) -> AudioSpec:
    """Seconds rules from the configs: the DiT window times the VAE hop, and the duration conditioner's range.

    A clip is cut from the decoded window (program.clip_samples), so it ends within the window as well as within
    the conditioner's range, and holds at least one sample."""
    dit = ckpt.parse_component("transformer", StableAudioDiTConfig.from_diffusers)
    vae = ckpt.parse_component("vae", OobleckDecoderConfig.from_diffusers)
    projection = ckpt.parse_component("projection_model", ProjectionConfig.from_diffusers)
    window = dit.sample_size * vae.hop_length / vae.sampling_rate
    return AudioSpec(max_seconds=window, default_seconds=window, min_start=projection.min_value,
                     max_end=min(projection.max_value, window), sample_rate=vae.sampling_rate,
                     min_seconds=1.0 / vae.sampling_rate)


def card_from_checkpoint(path: str | Path) -> ModelCard:
    ckpt = DiffusersDir.open(path)
    check_pipeline(ckpt)
    return stable_audio_card(ckpt.root.name, str(ckpt.root), audio_spec(ckpt),
                             description=f"Stable Audio Open text-to-audio from {ckpt.root}")


def stable_audio_card(model_id: str, source: str, audio: AudioSpec, *, description: str,
                      defaults: SamplingDefaults = DEFAULTS, notes: tuple[str, ...] = (),
                      precision: str = "float16") -> ModelCard:
    return CARDS.card(
        model_id, source, {"denoise": LoopSpec(samplers=SAMPLERS)},
        components=component_table(precision, "transformer", "vae", "text_encoder", "projection_model", "tokenizer",
                                   "scheduler", float32=("vae", "projection_model")),
        tasks=frozenset({Task.T2A}), produces_audio=True, audio=audio,
        request_blocks=(BlockSpec(AUDIO_LENGTH),),
        inputs=frozenset({"init_audio"}),  # a waveform the clip starts from (the pipeline's initial_audio_waveforms)
        optional_fields=READS,
        precision=precision, sampling_defaults=defaults, geometry=NO_FRAMES, description=description, notes=notes,
    )
