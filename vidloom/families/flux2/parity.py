"""FLUX.2 Klein's parity map against Flux2KleinPipeline."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from vidloom.core.request import GenerationRequest
from vidloom.parity.family import FamilyParity, ParityMaps, generator_for
from vidloom.parity.taps import BlockList


def _call_flux2_klein(pipe: Any, scheduler: Mapping[str, Any], request: GenerationRequest,
                      callback: dict[str, Any]) -> np.ndarray:
    out = pipe(
        prompt=request.prompt, image=list(request.image) if request.image else None, height=request.height,
        width=request.width, num_inference_steps=request.num_inference_steps, guidance_scale=request.guidance_scale,
        generator=generator_for(request), output_type="np", **callback,
    )
    return np.asarray(out.images)  # [1, H, W, 3]: one frame, like our video slot



FLUX2_KLEIN = FamilyParity(
    pipeline="Flux2KleinPipeline",
    # The position ids differ in layout (ours [N, 4] shared by the batch, theirs [B, N, 4]): not compared;
    # a wrong id shows at the first block anyway.
    our_inputs={"img": "img", "txt": "txt", "timestep": "timestep"},
    their_inputs={"hidden_states": "img", "encoder_hidden_states": "txt", "timestep": "timestep"},
    blocks={
        # The reference's double blocks return (text, image); ours the joint [text, image] stream, split here.
        "double_blocks": (BlockList("double_blocks", ("txt", "img"), split_by="text_tokens"),
                          BlockList("transformer_blocks", ("txt", "img"))),
        "single_blocks": (BlockList("single_blocks"), BlockList("single_transformer_blocks")),
    },
    call=_call_flux2_klein,
    # Klein encodes an empty negative prompt itself; sampler and shift are its own schedule's.
    refused=("negative_prompt", "video", "sampler", "flow_shift"),
)

PARITY = ParityMaps(pipelines=(FLUX2_KLEIN,))
