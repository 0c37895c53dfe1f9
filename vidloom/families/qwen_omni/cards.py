"""Cards for Qwen2.5-Omni transformers checkpoints (config.json architectures Qwen2_5OmniForConditionalGeneration).

Chat (the thinker's "ar_decode" loop, text in, text out) always; speech (thinker -> talker ->
token2wav -> vocoder) when the checkpoint has a talker and a speaker table. Audio and image parts of a chat
reach the thinker through its towers when the checkpoint has them (vidloom.models.omni_media); without them
such parts are refused by name.
"""

from __future__ import annotations

from pathlib import Path

from vidloom.core.capabilities import Capabilities
from vidloom.core.card import ComponentSpec, Geometry, LoopSpec, ModelCard, RecipeSpec, SamplingDefaults
from vidloom.core.card_kit import refusals
from vidloom.core.errors import CheckpointError
from vidloom.loading.diffusers_dir import read_json
from vidloom.families.qwen_omni.speakers import SPEAKER_FILE

FAMILY = "qwen-omni"
ARCHITECTURE = "Qwen2_5OmniForConditionalGeneration"
# config.json "architectures" names of this checkpoint layout: the released Qwen/Qwen2.5-Omni-3B and -7B files
# say Qwen2_5OmniModel (their preview-era class name; vLLM's registry maps it the same way), transformers'
# save_pretrained of today's class writes ARCHITECTURE.
ARCHITECTURES = (ARCHITECTURE, "Qwen2_5OmniModel")
PROGRAM = "vidloom.families.qwen_omni.program:build_program"
SPEECH = "vidloom.families.qwen_omni.speech:admit_speech"
MEMORY_ESTIMATOR = "vidloom.families.qwen_omni.memory:request_estimator"  # speech requests (SpeechPrompt)
AR_LOOP = "ar_decode"
SPEECH_LOOPS = ("thinker", "talker", "token2wav")
# Qwen2.5-Omni's model card: the system prompt the model was trained to speak under (audio output needs it).
SPOKEN_SYSTEM_PROMPT = ("You are Qwen, a virtual human developed by the Qwen Team, Alibaba Group, capable of "
                        "perceiving auditory and visual inputs, as well as generating text and speech.")
# Served context per sequence (Qwen2.5-Omni's thinker is trained to 32768 positions).
CONTEXT_WINDOW = 32768
# fp8_weights and compile reach the thinker and talker through their compile units (each block's work before
# and after attention; OmniDecoder.compile_units); attention_backend picks the SDPA kernels their KV stores call;
# cuda_graphs replays their paged decode steps (one token per sequence) from graphs captured per batch-size bucket
# (runtime.decode_graphs; OmniDecoder.decode_graphs), prefills and token2wav staying eager.
CAPABILITIES = Capabilities(
    frozenset({"kv_cache_budget_bytes", "kv_pool_tokens", "fp8_weights", "compile", "attention_backend",
               "cuda_graphs"}),
    refusals("offload_idle_expert", "two_stage", "devices", "components",
             warmup_shapes="no denoise shapes: speech and chat only",
             offload_text_encoder="the thinker is the model: there is no separate text encoder",
             prompt_cache_size="prompts are prefilled into the paged KV per request",
             cfg_mode="token2wav's guidance runs its two branches in one batch already",
             vae_tile="no VAE", step_cache="no denoiser declared to the step caches",
             kv_session_ttl_s="no causal video rollout whose KV could be kept",
             batching="no denoise step declared to the batcher: chats and the thinker share paged decode forwards "
                      "under every policy; talker and token2wav steps run per request"),
)
CAPABILITY_ROWS = {FAMILY: CAPABILITIES}
# The card generates no images or video (tasks is empty): these fill the contract and are never read.
NO_GENERATION = SamplingDefaults(height=16, width=16, num_frames=1, fps=1, num_inference_steps=1,
                                 guidance_scale=1.0, flow_shift=1.0, sampler="none")


def is_omni_checkpoint(path: Path) -> bool:
    config = Path(path) / "config.json"
    if not config.is_file():
        return False
    try:
        return bool(set(ARCHITECTURES) & set(read_json(config).get("architectures") or ()))
    except CheckpointError:
        return False


def card_from_checkpoint(path: str | Path) -> ModelCard:
    root = Path(path).expanduser()
    raw = read_json(root / "config.json")
    if not set(ARCHITECTURES) & set(raw.get("architectures") or ()):
        raise CheckpointError(f"{root}/config.json: architectures {raw.get('architectures')!r}, expected one of "
                              f"{', '.join(ARCHITECTURES)}")
    speaks = bool(raw.get("enable_audio_output", True)) and (root / SPEAKER_FILE).is_file()
    return omni_card(root.name, str(root), speaks=speaks,
                     description=f"Qwen2.5-Omni (chat{', speech' if speaks else ''}) from {root}")


def omni_card(model_id: str, source: str, *, speaks: bool, description: str, notes: tuple[str, ...] = (),
              precision: str = "bfloat16") -> ModelCard:
    loops = {AR_LOOP: LoopSpec()}
    components = {"thinker": ComponentSpec(precision), "tokenizer": ComponentSpec()}
    if speaks:
        loops.update({name: LoopSpec() for name in SPEECH_LOOPS})
        components.update({"talker": ComponentSpec(precision), "token2wav": ComponentSpec("float32"),
                           "speakers": ComponentSpec()})
    return ModelCard(
        model_id=model_id, family=FAMILY, components=components, loops=loops, tasks=frozenset(),
        precision=precision, sampling_defaults=NO_GENERATION, geometry=Geometry(1, 1),
        recipe=RecipeSpec(method="pretrained", loop=AR_LOOP), program=PROGRAM, source=source,
        description=description, notes=notes + (() if speaks else ("text only: no talker or speaker table",)),
        context_window=CONTEXT_WINDOW, capabilities=CAPABILITIES,
        speech=SPEECH if speaks else None, memory_estimator=MEMORY_ESTIMATOR if speaks else None,
        spoken_system_prompt=SPOKEN_SYSTEM_PROMPT if speaks else None,
    )
