"""VideoGenerator: the offline Python API (from_pretrained, generate)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from vidloom import registry
from vidloom.core.card import ModelCard
from vidloom.core.deploy import DeployConfig
from vidloom.core.output import EventCallback, VideoOutput
from vidloom.core.request import GenerationRequest, Task
from vidloom.runtime.engine import CancellationToken, Engine
from vidloom.runtime.results import video_output

if TYPE_CHECKING:
    from vidloom.core.parallel import ParallelPlan
    from vidloom.runtime.parallel.engine import ParallelEngine
    from vidloom.runtime.parallel.worker import PoolOptions


class VideoGenerator:
    """A loaded model plus a sync engine. One instance serves many `generate` calls.

    With devices > 1 the engine is a ParallelEngine over worker processes; call `close()`
    (or use the generator as a context manager) to stop them; they also stop at exit.
    """

    def __init__(self, engine: Engine | ParallelEngine) -> None:
        self.engine = engine

    @classmethod
    def from_pretrained(
        cls,
        model: str | Path = registry.DEFAULT_MODEL,
        *,
        device: str | torch.device | None = None,
        dtype: torch.dtype | str | None = None,
        cache_dir: str | Path | None = None,
        deploy: DeployConfig | None = None,
        devices: int | None = None,
        parallel: ParallelPlan | None = None,
        pool_options: PoolOptions | None = None,
    ) -> "VideoGenerator":
        """Load a registered model id or a diffusers checkpoint directory.

        device: defaults to CUDA when available, else CPU. dtype: defaults to the
        card's precision on CUDA and float32 on CPU. deploy: performance and memory
        options (default: the plain reference path). Nothing is downloaded.

        devices / parallel: run on several devices, one worker process each (they
        override deploy.devices / deploy.parallel; devices defaults to the plan's
        sp x cfg). An invalid plan raises DeployError before any process starts.
        pool_options: the pool's timeouts and debug checks (default: PoolOptions.from_env()).
        """
        deploy = _with_parallel(deploy or DeployConfig(), devices, parallel)
        card, checkpoint, device, dtype = _resolve(model, device, dtype, cache_dir)
        engine: Engine | ParallelEngine
        if deploy.devices > 1:
            from vidloom.runtime.parallel.launch import launch_engine

            engine = launch_engine(str(model), card, checkpoint, device, dtype, deploy, pool_options)
        else:
            instance = registry.load_instance(card, checkpoint, device, dtype, deploy)
            engine = Engine(instance, registry.import_target(card.program)(instance))
        try:
            engine.warmup(deploy.warmup_shapes)
        except BaseException:
            cls(engine).close()
            raise
        return cls(engine)

    def close(self) -> None:
        """Stop the worker processes of a multi-device engine (nothing to do on one device)."""
        from vidloom.runtime.parallel.engine import ParallelEngine

        if isinstance(self.engine, ParallelEngine):
            self.engine.close()

    def __enter__(self) -> "VideoGenerator":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def card(self) -> ModelCard:
        return self.engine.instance.card

    def generate(
        self,
        prompt: str,
        *,
        negative_prompt: str | None = None,
        height: int | None = None,
        width: int | None = None,
        num_frames: int | None = None,
        fps: int | None = None,
        num_inference_steps: int | None = None,
        guidance_scale: float | None = None,
        flow_shift: float | None = None,
        sampler: str | None = None,
        seed: int | None = None,
        step_cache_threshold: float | None = None,
        image: Any = None,
        last_image: Any = None,
        video: Any = None,
        strength: float | None = None,
        guidance_scale_2: float | None = None,
        on_event: EventCallback | None = None,
        cancel: CancellationToken | None = None,
    ) -> VideoOutput:
        """Generate a video; fields left None take the card's sampling defaults.

        step_cache_threshold overrides the deployment's step-cache threshold for this call.
        image / last_image (a PIL image, an HxWx3 array or a path) make it image-to-video (first, and
        last, frame); video (a list of frames, an array or a file) with strength makes it video-to-video;
        guidance_scale_2 is the low-noise expert's guidance on two-expert (Wan2.2 A14B) checkpoints.
        The card says which of these it accepts (InvalidRequest names any other).
        """
        request = GenerationRequest(
            prompt=prompt, task=Task.T2V, negative_prompt=negative_prompt, height=height, width=width,
            num_frames=num_frames, fps=fps, num_inference_steps=num_inference_steps,
            guidance_scale=guidance_scale, flow_shift=flow_shift, sampler=sampler, seed=seed,
            step_cache_threshold=step_cache_threshold, image=image, last_image=last_image, video=video,
            strength=strength, guidance_scale_2=guidance_scale_2,
        )
        return self.run(request, on_event=on_event, cancel=cancel)

    def run(
        self,
        request: GenerationRequest,
        on_event: EventCallback | None = None,
        cancel: CancellationToken | None = None,
    ) -> VideoOutput:
        """Run a prepared request (InvalidRequest before any work; Cancelled at a step boundary)."""
        return video_output(self.card, self.engine.run(request, on_event=on_event, cancel=cancel))


def _with_parallel(deploy: DeployConfig, devices: int | None, parallel: ParallelPlan | None) -> DeployConfig:
    if devices is None and parallel is None:
        return deploy
    plan = parallel if parallel is not None else deploy.parallel
    return dataclasses.replace(deploy, parallel=plan, devices=devices if devices is not None else plan.world_size)


def follow_torchrun(
    model: str | Path = registry.DEFAULT_MODEL,
    *,
    device: str | torch.device | None = None,
    dtype: torch.dtype | str | None = None,
    cache_dir: str | Path | None = None,
    deploy: DeployConfig,
    pool_options: PoolOptions | None = None,
) -> bool:
    """Under torchrun, what ranks other than 0 run instead of from_pretrained: load the same model,
    then follow rank 0's commands until it shuts down. True after a clean shutdown."""
    from vidloom.runtime.parallel.launch import follow_torchrun as follow

    _, checkpoint, device, dtype = _resolve(model, device, dtype, cache_dir)
    return follow(str(model), checkpoint, device, dtype, deploy, pool_options)


def _resolve(
    model: str | Path, device: str | torch.device | None, dtype: torch.dtype | str | None, cache_dir: str | Path | None
) -> tuple[ModelCard, Path, torch.device, torch.dtype | None]:
    card = registry.resolve_card(model)
    checkpoint = registry.resolve_checkpoint(card, Path(cache_dir) if cache_dir else None)
    resolved_device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    return card, checkpoint, resolved_device, getattr(torch, dtype) if isinstance(dtype, str) else dtype
