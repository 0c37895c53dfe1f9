"""The capability audit's tables (tests/integration/test_capability_audit.py): per kind of checkpoint (a column of
`vidloom models --capabilities`) a tiny checkpoint writer and a small request, per deploy feature a value that
switches it on."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from tests.helpers.adapter_checkpoints import write_tiny_pipeline
from tests.helpers.cosmos3_action_checkpoints import write_tiny_cosmos3_action
from tests.helpers.cosmos3_checkpoints import COSMOS3_A, strip_generation, write_tiny_cosmos3
from tests.helpers.far_checkpoints import FAR_A, write_tiny_far
from tests.helpers.flux2_checkpoints import TINY_BASE, TINY_DISTILLED, write_tiny_flux2
from tests.helpers.helios_checkpoints import TINY_A as HELIOS_A, write_tiny_helios
from tests.helpers.hunyuan15_checkpoints import write_pipeline as write_hunyuan15
from tests.helpers.ltx2_checkpoints import CONFIGS as LTX2_CONFIGS, write_tiny_ltx2
from tests.helpers.qwen3_omni_checkpoints import THINKER_A, write_tiny_thinker
from tests.helpers.qwen_image_checkpoints import write_qwen_image_wide
from tests.helpers.qwen_omni_checkpoints import OMNI_A, write_tiny_omni
from tests.helpers.sana_wm_checkpoints import SANA_WM_A, write_tiny_refiner, write_tiny_sana_wm
from tests.helpers.stable_audio_checkpoints import TINY_STEREO, write_tiny_stable_audio
from tests.helpers.wan22_checkpoints import write_tiny_a14b
from tests.helpers.wan_checkpoints import TINY_A, write_tiny_wan
from tests.helpers.wan_i2v_checkpoints import make_image
from vidloom.core.parallel import ParallelPlan
from vidloom.core.request import GenerationRequest, Task


def _with_refiner(folder: Path) -> Path:
    write_tiny_refiner(folder, SANA_WM_A)  # two_stage reads <folder>/refiner/
    return folder


# Column label -> writer of a tiny checkpoint of that kind.
WRITERS: dict[str, Callable[[Path], Path]] = {
    "wan": lambda d: write_tiny_wan(d, TINY_A),
    "wan2.2-a14b": lambda d: write_tiny_a14b(d, TINY_A),
    "anyflow-far": lambda d: write_tiny_far(d, FAR_A),
    "flux2": lambda d: write_tiny_flux2(d, TINY_BASE),
    "flux2-distilled": lambda d: write_tiny_flux2(d, TINY_DISTILLED),
    "ltx2": lambda d: write_tiny_ltx2(d, LTX2_CONFIGS[0], upsampler=True),
    "cosmos3": lambda d: write_tiny_cosmos3(d, COSMOS3_A),
    "cosmos3-actions": lambda d: write_tiny_cosmos3_action(d),  # kv_session_ttl_s acts: test_cosmos3_action_session
    "cosmos3-chat-only": lambda d: strip_generation(write_tiny_cosmos3(d, COSMOS3_A)),
    # Its one feature (attention_backend, diffusers' dispatcher) is checked in tests/integration/test_adapter_server.py.
    "adapted diffusers pipeline": lambda d: write_tiny_pipeline(d, "cogvideox"),
    "qwen-omni": lambda d: write_tiny_omni(d, OMNI_A),
    "qwen3-omni": lambda d: write_tiny_thinker(d, THINKER_A),
    "qwen-image": write_qwen_image_wide,  # three blocks: a step cache has blocks to skip
    "hunyuan15": lambda d: write_hunyuan15(d, "p1") and d,
    "sana-wm": lambda d: _with_refiner(write_tiny_sana_wm(d, SANA_WM_A)),
    "stable-audio": lambda d: write_tiny_stable_audio(d, TINY_STEREO),
    "helios": lambda d: write_tiny_helios(d, HELIOS_A),
}
# A small request each kind runs (guidance on, so CFG has two branches); its size is also the warmup shape.
REQUESTS: dict[str, dict[str, Any]] = {
    "wan": dict(height=32, width=48, num_frames=5, num_inference_steps=2, guidance_scale=5.0),
    "wan2.2-a14b": dict(height=32, width=48, num_frames=5, num_inference_steps=2, guidance_scale=5.0),
    "anyflow-far": dict(height=32, width=48, num_frames=9, num_inference_steps=2, guidance_scale=3.0),
    "flux2": dict(task=Task.T2I, height=32, width=48, num_frames=1, num_inference_steps=2, guidance_scale=4.0),
    "ltx2": dict(height=64, width=64, num_frames=9, fps=25, num_inference_steps=2, guidance_scale=3.0),
    "qwen-image": dict(task=Task.T2I, height=32, width=48, num_frames=1, num_inference_steps=2, guidance_scale=4.0),
    "hunyuan15": dict(height=32, width=48, num_frames=5, num_inference_steps=2, guidance_scale=5.0),
    "cosmos3": dict(height=32, width=32, num_frames=9, num_inference_steps=2, guidance_scale=3.0, fps=16),
    "stable-audio": dict(task=Task.T2A, seconds=0.5, num_inference_steps=2, guidance_scale=7.0),
    "helios": dict(height=32, width=48, num_frames=33, num_inference_steps=2, guidance_scale=5.0),  # one chunk
    "sana-wm": dict(height=64, width=96, num_frames=17, camera="jw-16", image=make_image(70, 40, 1),
                    intrinsics=[50.0, 52.0, 35.0, 20.0], num_inference_steps=2, guidance_scale=3.0),
}
# A non-default value per feature (one that runs on these tiny checkpoints).
ENABLE: dict[str, Callable[[str], dict[str, Any]]] = {
    "fp8_weights": lambda kind: dict(fp8_weights=True),
    "compile": lambda kind: dict(compile=True, compile_backend="eager"),
    "warmup_shapes": lambda kind: dict(warmup_shapes=(warmup_shape(kind),)),
    "offload_text_encoder": lambda kind: dict(offload_text_encoder=True),
    "prompt_cache_size": lambda kind: dict(prompt_cache_size=3),
    # LTX-2's VAE is 32x (SANA-WM decodes with it): tiles of 3 latent cells every 2 on a 4x4 latent
    # (VAE_TILE_REQUESTS), no 1-cell edge tile.
    "vae_tile": lambda kind: dict(vae_tile=96, vae_tile_stride=64) if kind in LTX2_VAE else dict(vae_tile=32,
                                                                                                 vae_tile_stride=16),
    # Kinds that mask every attention call refuse flash/sage by that reason (test_decoder_acceleration.py): they
    # take the math kernel, which runs here.
    "attention_backend": lambda kind: dict(attention_backend="math" if kind in MASKED_ATTENTION else "flash"),
    "cfg_mode": lambda kind: dict(cfg_mode="batched"),
    # A DBCache preset with TaylorSeer (fbcache is its F1B0 case): every block past the first reused after step 0.
    "step_cache": lambda kind: dict(step_cache="fast", step_cache_warmup=1, step_cache_threshold=1e9),
    "cuda_graphs": lambda kind: dict(cuda_graphs=True),
    "kv_cache_budget_bytes": lambda kind: dict(kv_cache_budget_bytes=1024),
    "kv_pool_tokens": lambda kind: dict(kv_pool_tokens=64),
    "kv_session_ttl_s": lambda kind: dict(kv_session_ttl_s=60.0),
    "offload_idle_expert": lambda kind: dict(offload_idle_expert=True),
    "two_stage": lambda kind: dict(two_stage=True),
    "devices": lambda kind: dict(devices=SP.get(kind, 2), parallel=ParallelPlan(sp=SP.get(kind, 2))),
    "cfg_parallel": lambda kind: dict(devices=2, parallel=ParallelPlan(cfg=2)),
    # Rank 1 holds the encoder: rank 0, whose video is compared, receives the encoded prompt.
    "text_encoder_rank": lambda kind: dict(devices=SP.get(kind, 2),
                                           parallel=ParallelPlan(sp=SP.get(kind, 2), text_encoder_rank=1)),
    # The folder's transformer with its weights scaled (written by the `folders` fixture); a kind that refuses the
    # feature never reaches the file.
    "components": lambda kind: dict(
        components={"transformer": str(COMPONENT_FILES.get(kind, "transformer.safetensors"))}),
    "batching": lambda kind: {},  # a server policy (--policy batch), no deploy field: _batching serves two requests
}
# kind -> a transformer file for `components`, next to that kind's tiny folder.
COMPONENT_FILES: dict[str, Path] = {}
# Honoured, but nothing on this machine can observe it; where it is tested instead.
NOT_OBSERVABLE_HERE = {
    "offload_text_encoder": "on CPU the encoder already lives in host memory (tests/gpu move it to the device)",
}
# A pool starts one process per rank; here its ranks are threads sharing a tensor exchange (tests/helpers/thread_comm),
# each running rank_engine as a worker does (tests/integration/test_parallel*.py start real processes).
IN_THREADS = ("devices", "cfg_parallel", "text_encoder_rank")
SP = {"flux2": 3, "qwen-image": 3}  # sequence-parallel degree: the tiny checkpoints' head counts
CUDA_ONLY = ("attention_backend", "cuda_graphs")  # refused on CPU by the kernel itself, naming CUDA
LTX2_VAE = frozenset({"ltx2", "sana-wm"})
MASKED_ATTENTION = frozenset({"ltx2", "cosmos3", "cosmos3-actions", "cosmos3-chat-only", "qwen-omni", "qwen3-omni"})


def warmup_shape(kind: str) -> tuple[int, int, int]:
    request = REQUESTS[kind] if "height" in REQUESTS.get(kind, {}) else REQUESTS["wan"]  # audio kinds: no frames
    return request["height"], request["width"], request["num_frames"]


def scaled_transformer(folder: Path) -> Path:
    """The folder's transformer weights times 0.9 as one diffusers-layout file beside the folder."""
    from safetensors.torch import load_file, save_file

    source = folder / "transformer" / "diffusion_pytorch_model.safetensors"
    if not source.is_file():  # a sharded or transformer-less folder: its kinds do not declare `components`
        return folder.parent / "transformer.safetensors"
    scaled = {key: t * 0.9 if t.is_floating_point() else t for key, t in load_file(str(source)).items()}
    save_file(scaled, str(folder.parent / "transformer.safetensors"))
    return folder.parent / "transformer.safetensors"


def audit_request(kind: str, seed: int = 3) -> GenerationRequest:
    return GenerationRequest(prompt="a red fox jumps", negative_prompt="blurry", seed=seed, **REQUESTS[kind])
