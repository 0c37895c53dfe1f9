"""Cards for Qwen3-Omni transformers checkpoints (config.json architectures Qwen3OmniMoeForConditionalGeneration).

Chat (the thinker's "ar_decode" loop, text in, text out) on the runtime's paged KV pool; speech (thinker ->
talker with its code predictor -> code2wav) when the checkpoint has a talker (enable_audio_output with a
talker_config and a code2wav_config). Audio, image and video parts of a chat reach the thinker through its towers
(transformers' encoder modules) when the checkpoint has them and their preprocessor_config.json (a spoken answer
reads them too); which parts a loaded model reads is its program's `chat_inputs`
(GET /v1/models/{id}: capabilities.chat_inputs).
"""

from __future__ import annotations

from pathlib import Path

from vidloom.core.capabilities import Capabilities
from vidloom.core.card import ComponentSpec, Geometry, LoopSpec, ModelCard, RecipeSpec, SamplingDefaults
from vidloom.core.card_kit import refusals
from vidloom.core.errors import CheckpointError
from vidloom.loading.diffusers_dir import read_json

FAMILY = "qwen3-omni"
ARCHITECTURE = "Qwen3OmniMoeForConditionalGeneration"
PROGRAM = "vidloom.families.qwen3_omni.program:build_program"
SPEECH = "vidloom.families.qwen3_omni.speech:admit_speech"
MEMORY_ESTIMATOR = "vidloom.families.qwen3_omni.memory:request_estimator"  # speech requests (SpeechPrompt)
SPEECH_LOOPS = ("thinker", "talker", "code2wav")
AR_LOOP = "ar_decode"
# Served context per sequence (Qwen3-Omni's thinker config: max_position_embeddings 65536).
CONTEXT_WINDOW = 65536
# cuda_graphs replays the thinker's and talker's paged decode steps per batch-size bucket (runtime.decode_graphs);
# under it the MoE layers dispatch without a host read (SparseMoE.fixed_experts).
CAPABILITIES = Capabilities(
    frozenset({"kv_cache_budget_bytes", "kv_pool_tokens", "attention_backend", "cuda_graphs"}),
    refusals("offload_idle_expert", "two_stage", "devices", "components",
             fp8_weights="the experts are stacked tensors, not the Linear layers FP8 quantizes",
             compile="the expert dispatch sizes its groups on the host each layer (a graph break)",
             warmup_shapes="no denoise shapes: chat and speech only",
             offload_text_encoder="the thinker is the model: there is no separate text encoder",
             prompt_cache_size="prompts are prefilled into the paged KV per request",
             cfg_mode="no guidance: chat and speech only", vae_tile="no VAE",
             step_cache="no denoiser declared to the step caches",
             kv_session_ttl_s="no causal video rollout whose KV could be kept",
             batching="no denoise step declared to the batcher: chats share paged decode forwards under every policy"),
)
CAPABILITY_ROWS = {FAMILY: CAPABILITIES}
# The card generates no images or video (tasks is empty): these fill the contract and are never read.
NO_GENERATION = SamplingDefaults(height=16, width=16, num_frames=1, fps=1, num_inference_steps=1,
                                 guidance_scale=1.0, flow_shift=1.0, sampler="none")
MEDIA_IN = ("audio, image and video parts (video_url, with its sound track when use_audio_in_video) in through "
            "the thinker's towers where the checkpoint has them (thinker.audio_tower.*, thinker.visual.*, "
            "preprocessor_config.json); text-only otherwise; a spoken answer reads them too (their rows in the "
            "talker's prompt, at the talker's own positions)")
NO_TALKER = "text out only: the checkpoint has no talker (enable_audio_output false, or no talker/code2wav config)"


def card_from_checkpoint(path: str | Path) -> ModelCard:
    root = Path(path).expanduser()
    raw = read_json(root / "config.json")
    if ARCHITECTURE not in (raw.get("architectures") or ()):
        raise CheckpointError(f"{root}/config.json: architectures {raw.get('architectures')!r}, "
                              f"expected {ARCHITECTURE}")
    speaks = (bool(raw.get("enable_audio_output", True)) and isinstance(raw.get("talker_config"), dict)
              and isinstance(raw.get("code2wav_config"), dict))
    return qwen3_omni_card(root.name, str(root), speaks=speaks,
                           description=f"Qwen3-Omni (chat{', speech' if speaks else ''}) from {root}")


def qwen3_omni_card(model_id: str, source: str, *, description: str, speaks: bool = False,
                    notes: tuple[str, ...] = (), precision: str = "bfloat16") -> ModelCard:
    loops = {AR_LOOP: LoopSpec()}
    components = {"thinker": ComponentSpec(precision), "tokenizer": ComponentSpec()}
    if speaks:
        loops.update({name: LoopSpec() for name in SPEECH_LOOPS})
        components.update({"talker": ComponentSpec(precision), "code2wav": ComponentSpec("float32")})
    return ModelCard(
        model_id=model_id, family=FAMILY, components=components, loops=loops, tasks=frozenset(),
        precision=precision, sampling_defaults=NO_GENERATION, geometry=Geometry(1, 1),
        recipe=RecipeSpec(method="pretrained", loop=AR_LOOP), program=PROGRAM, source=source,
        description=description, notes=notes + (MEDIA_IN,) + (() if speaks else (NO_TALKER,)),
        context_window=CONTEXT_WINDOW, capabilities=CAPABILITIES, speech=SPEECH if speaks else None,
        memory_estimator=MEMORY_ESTIMATOR if speaks else None,
    )
