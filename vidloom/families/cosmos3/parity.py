"""Cosmos3's parity map against Cosmos3OmniPipeline (the generation pathway)."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from vidloom.core.request import GenerationRequest
from vidloom.parity.family import FamilyParity, ParityMaps, generator_for
from vidloom.parity.taps import BlockList


def _call_cosmos3(pipe: Any, scheduler: Mapping[str, Any], request: GenerationRequest,
                  callback: dict[str, Any]) -> np.ndarray:
    out = pipe(
        request.prompt, negative_prompt=request.negative_prompt, image=request.image[0] if request.image else None,
        num_frames=request.num_frames, height=request.height, width=request.width, fps=request.fps,
        num_inference_steps=request.num_inference_steps, guidance_scale=request.guidance_scale,
        generator=generator_for(request), output_type="np", enable_safety_check=False, **callback,
    )
    return np.asarray(out.video)  # [F, H, W, 3]



COSMOS3 = FamilyParity(  # text-to-image/video and image-to-video through the generation pathway
    pipeline="Cosmos3OmniPipeline",
    # Our steps run only the generated tokens against the cached text prefix (the reference re-runs the
    # prefix each step), through the generator's stages, never a forward: no input / prediction taps. The
    # reference's mixture-of-transformers layers return (text, generated) streams; the generated one is ours.
    our_inputs={}, their_inputs={},
    blocks={"blocks": (BlockList("blocks", ("gen",)), BlockList("layers", ("", "gen")))},
    call=_call_cosmos3,
    denoisers=("generator",),
    reference_denoisers=("transformer",),
    their_latents=lambda latents: latents[0],  # the pipeline steps a leading batch axis of one
    load_kwargs={"enable_safety_checker": False},
    untapped=frozenset({"input", "output"}),
    refused=("last_image", "video", "reason", "sound", "action", "sampler", "flow_shift"),
)

PARITY = ParityMaps(pipelines=(COSMOS3,))
