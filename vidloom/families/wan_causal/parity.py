"""AnyFlow-FAR's parity map against AnyFlowFARPipeline (KV-cached chunk rollout)."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from vidloom.core.request import GenerationRequest
from vidloom.parity.family import FamilyParity, ParityMaps, generator_for
from vidloom.parity.taps import BlockList


def _call_far(pipe: Any, scheduler: Mapping[str, Any], request: GenerationRequest,
              callback: dict[str, Any]) -> np.ndarray:
    from vidloom.families.wan_causal.loop import chunk_partition

    latent_frames = (int(request.num_frames) - 1) // pipe.vae_scale_factor_temporal + 1  # type: ignore[arg-type]
    partition = chunk_partition(latent_frames, tuple(pipe.transformer.config.chunk_partition))
    out = pipe(
        prompt=request.prompt, negative_prompt=request.negative_prompt, height=request.height, width=request.width,
        num_frames=request.num_frames, num_inference_steps=request.num_inference_steps,
        guidance_scale=request.guidance_scale, chunk_partition=list(partition), generator=generator_for(request),
        output_type="np", use_kv_cache=True, **callback,
    )
    return out.frames[0]


def _far_chunk_latents(state: Any) -> Any:
    """The chunk being generated; after its last step our loop has moved it into the video (and the next
    chunk's noise into `chunk_latents`), so it is read back from there."""
    if state.step > 0:
        return state.chunk_latents
    k = state.chunk - 1
    return state.latents[:, :, state.frame_starts[k]:state.frame_starts[k + 1]]



ANYFLOW_FAR = FamilyParity(  # causal chunk rollout with the KV cache (use_kv_cache=True), text-to-video
    pipeline="AnyFlowFARPipeline",
    # Both sides batch the CFG branches as [uncond, cond] in one call per step; our step runs the network's
    # stages, not the transformer's forward: no input / prediction taps. Steps count across chunks.
    our_inputs={}, their_inputs={},
    blocks={"blocks": (BlockList("blocks"), BlockList("blocks"))},
    call=_call_far,
    output="rollout.video",  # the rollout decodes chunk by chunk as it goes
    loop="rollout",
    state_latents=_far_chunk_latents,
    their_latents=lambda latents: latents.permute(0, 2, 1, 3, 4),  # [B, F, C, h, w] -> ours [B, C, F, h, w]
    step_call=lambda kwargs: not kwargs.get("kv_cache_flag", {}).get("is_cache_step", False),
    untapped=frozenset({"input", "output"}),
    refused=("image", "last_image", "video", "extend_from", "sampler", "flow_shift"),
)

PARITY = ParityMaps(pipelines=(ANYFLOW_FAR,))
