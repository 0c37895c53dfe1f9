"""LoRA adapter admin routes: GET /v1/loras, POST /v1/loras, DELETE /v1/loras/{name} (behind the API key).

Loading reads the file and copies its low-rank weights on a worker thread, so the event loop keeps answering
and the device worker keeps stepping; running requests keep the adapters they started with (see lora.registry).
A deployment that fused its adapters into the weights at load (fuse_loras) lists them under `fused` and answers
409 to loading and unloading: the weights hold a fixed set, nothing can join or leave it at run time.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request

from vidloom.core.errors import CheckpointError
from vidloom.core.instance import ModelInstance
from vidloom.lora.registry import LORA_SLOT, attach_registry
from vidloom.serving.errors import APIError, engine_errors
from vidloom.serving.protocol import LoraLoadBody, body_doc
from vidloom.serving.request_body import read_body
from vidloom.serving.video_routes import jobs_of

router = APIRouter()


def served_instance(request: Request) -> Any | None:
    """The single-device engine's model instance; None for engines without one here (a multi-device pool)."""
    instance = jobs_of(request).engine.instance
    return instance if isinstance(instance, ModelInstance) else None


def _instance(request: Request) -> Any:
    instance = served_instance(request)
    if instance is None:
        raise APIError(400, "LoRA adapters are not supported on this engine (multi-device)", code="unsupported")
    return instance


def _refuse_if_fused(instance: Any, what: str) -> None:
    registry = instance.components.get(LORA_SLOT)
    if registry is not None and registry.fused:
        names = ", ".join(f.name for f in registry.fused)
        raise APIError(409, f"fuse_loras: this deployment fused {names} into its weights at load; adapters cannot "
                       f"be {what} at run time (restart without --fuse-loras for run-time adapters)",
                       param="fuse_loras", code="loras_fused")


def adapter_list(instance: Any) -> list[dict[str, Any]]:
    """The resident adapters in load order: name and file name (the server's paths stay private, as in errors)."""
    registry = instance.components.get(LORA_SLOT)
    return [] if registry is None else [{"name": a.name, "file": a.path.name} for a in registry.adapters]


@router.get("/v1/loras")
async def list_loras(request: Request) -> dict[str, Any]:
    instance = _instance(request)
    registry = instance.components.get(LORA_SLOT)
    fused = [] if registry is None else [{"name": f.name, "file": f.path.name, "scale": f.scale}
                                         for f in registry.fused]
    return {"object": "list", "data": adapter_list(instance), "fused": fused,
            "max_loras": registry.max_loras if registry is not None and not fused else None}


@router.post("/v1/loras", openapi_extra=body_doc(LoraLoadBody))
async def load_lora(request: Request) -> dict[str, Any]:
    body = await read_body(request, LoraLoadBody)
    instance = _instance(request)
    _refuse_if_fused(instance, "loaded")
    with engine_errors(lambda field: field):
        registry = attach_registry(instance)
        try:
            adapter = await asyncio.to_thread(registry.load, body.name, body.path, body.into)
        except CheckpointError as exc:
            raise APIError(400, f"path: {exc}", param="path", code="invalid_lora") from None
    return {"name": adapter.name, "file": adapter.path.name, "layers": len(adapter.layers)}


@router.delete("/v1/loras/{name}")
async def unload_lora(request: Request, name: str) -> dict[str, Any]:
    instance = _instance(request)
    _refuse_if_fused(instance, "unloaded")
    registry = instance.components.get(LORA_SLOT)
    if registry is None or name not in registry.names:
        raise APIError(404, f"no LoRA adapter {name!r} is loaded", param="name", code="lora_not_found")
    registry.unload(name)
    return {"name": name, "deleted": True}
