"""Deployed features one request runs without, because another of its features turns them off, and why.

Nothing is turned off silently: a run records each (RequestRun.turn_off), logs one line, and its result's metadata
carries them under "disabled" (runtime.results).
"""

from __future__ import annotations

from vidloom.core.deploy import DeployConfig


def conflicts(deploy: DeployConfig, *, step_cache: bool, graphs: bool, adapters: bool) -> dict[str, str]:
    """feature -> why, for the features this run's own step cache or LoRA adapters keep from acting
    (RequestRun.execute and its compile stance decide the same way)."""
    off: dict[str, str] = {}
    if graphs and step_cache:
        off["cuda_graphs"] = (f"step cache {deploy.step_cache!r} decides per step which blocks run, so its steps "
                              "run eagerly, never replayed from a captured graph")
    elif graphs and adapters:
        off["cuda_graphs"] = "LoRA adapters: a captured graph replays kernels recorded without them, so steps run eagerly"
    if adapters and deploy.compile:
        off["compile"] = "LoRA adapters: the compiled blocks were traced without them, so this request runs eagerly"
    return off


def alone_reason(deploy: DeployConfig, *, step_cache: bool, graphs: bool, adapters: bool) -> str | None:
    """Why this run's steps cannot share a forward with other requests' under policy "batch"; None: they can."""
    if step_cache:
        return f"step cache {deploy.step_cache!r}: each request decides for itself which blocks run"
    if graphs:
        return "cuda_graphs: steps replay graphs captured for one request"
    if adapters and deploy.compile:
        return "LoRA adapters on compiled blocks run eagerly under a stance set per request"
    return None
