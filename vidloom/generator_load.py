"""What VideoGenerator.from_pretrained and torchrun's followers run: resolve a model, load it on one device or
launch the worker pool, apply the LoRA options, warm up, and time each phase."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

import torch

from vidloom import registry
from vidloom.core import plugin
from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import DeployError
from vidloom.lora.registry import attach_registry
from vidloom.lora.step_adapters import LORA_ADAPTERS
from vidloom.placement import resolve_model
from vidloom.runtime.engine import Engine

if TYPE_CHECKING:
    from vidloom.core.parallel import ParallelPlan
    from vidloom.runtime.parallel.engine import ParallelEngine
    from vidloom.runtime.parallel.worker import PoolOptions


def load_engine(
    model: str | Path,
    *,
    device: str | torch.device | None,
    dtype: torch.dtype | str | None,
    cache_dir: str | Path | None,
    deploy: DeployConfig | None,
    devices: int | None,
    parallel: ParallelPlan | None,
    pool_options: PoolOptions | None,
    max_loras: int | None,
    fuse_loras: Mapping[str, str | Path | tuple[str | Path, float]] | None,
    components: Mapping[str, str | Path] | None,
) -> tuple[Engine | ParallelEngine, dict[str, float]]:
    """The warmed-up engine from_pretrained's arguments describe (VideoGenerator.from_pretrained documents them),
    and the seconds its phases took: "checkpoint" (resolve, write a demo), "weights" (load), "warmup". An engine
    whose warmup fails is closed before the error propagates."""
    from vidloom.loading.quiet import quiet_loading

    deploy = _with_components(_with_parallel(deploy or DeployConfig(), devices, parallel), components)
    engine: Engine | ParallelEngine
    started = time.perf_counter()
    with quiet_loading():
        card, checkpoint, device, dtype = resolve_model(model, device, dtype, cache_dir)
        resolved = time.perf_counter()
        if deploy.devices > 1:
            from vidloom.runtime.parallel.launch import launch_engine
            from vidloom.runtime.parallel.worker import LoraSetup

            fused = tuple((name, str(Path(path).expanduser().absolute()), scale) for name, (path, scale)
                          in _fused_entries(fuse_loras).items())
            engine = launch_engine(str(model), card, checkpoint, device, dtype, deploy, pool_options,
                                   LoraSetup(max_loras, fused), LORA_ADAPTERS)
        else:
            instance = registry.load_instance(card, checkpoint, device, dtype, deploy)
            engine = Engine(instance, plugin.resolve(card.program)(instance), adapters=LORA_ADAPTERS)
            if max_loras is not None:
                attach_registry(instance, max_loras)  # InvalidRequest("lora") on a family without adapters
            if fuse_loras:
                from vidloom.lora.fuse import fuse_adapters

                fuse_adapters(instance, _fused_entries(fuse_loras))
    loaded = time.perf_counter()
    try:
        engine.warmup(deploy.warmup_shapes)
    except BaseException:
        engine.close()
        raise
    return engine, {"checkpoint": resolved - started, "weights": loaded - resolved,
                    "warmup": time.perf_counter() - loaded}


def _fused_entries(
    fuse_loras: Mapping[str, str | Path | tuple[str | Path, float]] | None,
) -> dict[str, tuple[str | Path, float]]:
    """{name: (file, scale)}: a bare file fuses at scale 1."""
    return {name: value if isinstance(value, tuple) else (value, 1.0) for name, value in (fuse_loras or {}).items()}


def _with_parallel(deploy: DeployConfig, devices: int | None, parallel: ParallelPlan | None) -> DeployConfig:
    if devices is None and parallel is None:
        return deploy
    plan = parallel if parallel is not None else deploy.parallel
    return dataclasses.replace(deploy, parallel=plan, devices=devices if devices is not None else plan.world_size)


def _with_components(deploy: DeployConfig, components: Mapping[str, str | Path] | None) -> DeployConfig:
    if not components:
        return deploy
    if not isinstance(components, Mapping):
        raise DeployError(f"components must map component names to files, got {type(components).__name__}")
    merged = dict(deploy.components)
    for name, path in components.items():
        if not isinstance(path, (str, Path)):
            raise DeployError(f"components[{name!r}]: expected a file path, got {type(path).__name__}")
        merged[str(name)] = str(Path(path).expanduser().absolute())  # absolute: workers elsewhere read the same
    return dataclasses.replace(deploy, components=tuple(merged.items()))


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

    _, checkpoint, device, dtype = resolve_model(model, device, dtype, cache_dir)
    return follow(str(model), checkpoint, device, dtype, deploy, pool_options)
