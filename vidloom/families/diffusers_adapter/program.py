"""The adapted pipeline's program: the pipeline call (one loop, stepped by the runtime), then its output normalised
into the slots every family writes (uint8-ready frames in [0, 1], or audio with its sample rate)."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import torch

from vidloom.core.instance import ModelInstance
from vidloom.core.program import Node, NodeContext, Program
from vidloom.core.request import GenerationRequest
from vidloom.families.diffusers_adapter.audio import length_kwargs
from vidloom.families.diffusers_adapter.loop import PipelineLoop
from vidloom.families.diffusers_adapter.preflight import check_inputs
from vidloom.families.diffusers_adapter.signature import PipelineShape

# Request fields passed through to the pipeline's keyword of the same meaning (signature.FIELD_ARGS).
PASSED = ("height", "width", "num_frames", "fps", "num_inference_steps", "guidance_scale")


def build_program(instance: ModelInstance) -> Program:
    shape: PipelineShape = instance["shape"]
    sample_rate: int | None = instance.components.get("sample_rate")

    def kwargs_for(request: GenerationRequest) -> dict[str, Any]:
        return pipeline_kwargs(shape, request)

    def normalise(slots: Mapping[str, Any], ctx: NodeContext) -> dict[str, Any]:
        written = normalised_output(shape.output, slots["pipeline_output"], sample_rate)
        ctx.progress("decode", 1, 1)
        return written

    outputs = ("video", "audio", "sample_rate") if shape.output == "audio" else ("video",)
    hooks = instance.components.get("text_encoder_hooks", ())

    def encoded() -> None:
        for hook in hooks:
            hook.offload()

    fields = {arg: field for field, arg in shape.args.items()}
    pipe = instance["pipeline"]

    def check(request: GenerationRequest) -> None:
        check_inputs(pipe, kwargs_for(request), fields)

    loop = PipelineLoop(pipe, shape.hook, kwargs_for, encoded if hooks else None, fields)
    return Program(
        nodes=(
            Node("pipeline", reads=("request",), writes=("pipeline_output",), loop=loop),
            Node("normalise", reads=("pipeline_output",), writes=outputs, run=normalise),
        ),
        inputs=frozenset({"request"}),
        outputs=outputs,
        check=check,
    )


def pipeline_kwargs(shape: PipelineShape, request: GenerationRequest) -> dict[str, Any]:
    """The pipeline's keyword arguments for a resolved request: the fields it takes, the seed as a CPU generator
    (as diffusers' examples seed), numpy output. An empty negative prompt is left out: some pipelines (Qwen-Image)
    turn CFG on for any negative prompt given, "" included, and off without one."""
    kwargs: dict[str, Any] = {
        "prompt": request.prompt,
        "generator": torch.Generator("cpu").manual_seed(int(request.seed)),
    }
    if shape.takes_output_type:
        kwargs["output_type"] = "np"
    for name in PASSED:
        if name in shape.args:
            kwargs[shape.args[name]] = getattr(request, name)
    if "negative_prompt" in shape.args and request.negative_prompt:
        kwargs[shape.args["negative_prompt"]] = request.negative_prompt
    if "image" in shape.args and request.image:
        kwargs[shape.args["image"]] = request.image[0]
    if "video" in shape.args and request.video is not None:
        kwargs[shape.args["video"]] = list(request.video)
    kwargs.update(length_kwargs(shape, request))
    return kwargs


def normalised_output(kind: str, output: Any, sample_rate: int | None) -> dict[str, Any]:
    """Frames [F, H, W, 3] in [0, 1] ("video"), or audio [channels, samples] float32 with its rate (and no frames)."""
    if kind == "audio":
        audio = _array(output.audios)[0]
        if audio.ndim == 1:
            audio = audio[None]
        empty = np.zeros((0, 1, 1, 3), dtype=np.uint8)  # an audio model makes no frames
        return {"video": empty, "audio": np.ascontiguousarray(audio, dtype=np.float32), "sample_rate": sample_rate}
    if kind == "image":
        images = _array(output.images)
        return {"video": images[:1] if images.ndim == 4 else images[None]}
    frames = output.frames
    if isinstance(frames, (list, tuple)) and frames and isinstance(frames[0], (list, tuple)):
        frames = [np.stack([np.asarray(f, dtype=np.float32) / 255.0 for f in frames[0]])]  # PIL frames
    return {"video": _array(frames)[0]}


def _array(value: Any) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().to(device="cpu", dtype=torch.float32).numpy()
    return np.asarray(value, dtype=np.float32)
