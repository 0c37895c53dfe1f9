"""SANA-WM's parity map against SanaWMPipeline (stage 1 and the VAE decode)."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from vidloom.core.request import GenerationRequest
from vidloom.parity.align import Tolerance
from vidloom.parity.family import FamilyParity, ParityMaps, generator_for
from vidloom.parity.taps import BlockList


def _call_sana_wm(pipe: Any, scheduler: Mapping[str, Any], request: GenerationRequest,
                  callback: dict[str, Any]) -> np.ndarray:
    from diffusers import FlowMatchEulerDiscreteScheduler

    # The request's flow shift replaces the scheduler's, as our stage 1 does (the card's default is the saved one).
    pipe.scheduler = FlowMatchEulerDiscreteScheduler.from_config(scheduler, shift=float(request.flow_shift))
    camera = request.option("camera")  # resolved: families.sana_wm.camera.CameraInput
    pose = {"action": camera.action} if camera.action is not None else {"c2w": camera.c2w}
    out = pipe(
        image=request.image[0], prompt=request.prompt, negative_prompt=request.negative_prompt,
        intrinsics=camera.intrinsics, height=request.height, width=request.width, num_frames=request.num_frames,
        num_inference_steps=request.num_inference_steps, guidance_scale=request.guidance_scale,
        generator=generator_for(request), output_type="np", **pose, **callback,
    )
    return np.asarray(out.frames)  # [F, H, W, 3] in [0, 1]


SANA_WM = FamilyParity(  # stage 1 (the bidirectional DiT) and the LTX-2 VAE decode; the refiner is another pipeline
    pipeline="SanaWMPipeline",
    # Both sides batch CFG as [negative, positive] in one call; our network runs the DiT's stages with the
    # request's camera bound, never its forward: no input / prediction taps.
    our_inputs={}, their_inputs={},
    blocks={"blocks": (BlockList("blocks"), BlockList("blocks"))},
    call=_call_sana_wm,
    loop="stage1",
    # The softmax blocks run bf16 SDPA on both sides; an ulp-level difference upstream can flip one bf16
    # rounding (observed up to 5.5e-5 of a block output's scale on the first tiny config, 7e-6 on the second).
    # 5e-4 stays ~8x under one bf16 ulp (3.9e-3) and far under a wrong op (> 1e-3, see the tests).
    tolerance=Tolerance(atol=1e-4, rtol=5e-4),
    untapped=frozenset({"input", "output"}),
    refused=("last_image", "video", "sampler"),
)

PARITY = ParityMaps(pipelines=(SANA_WM,))
