"""LoRA adapter admin routes: GET /v1/loras (any key), POST /v1/loras and DELETE /v1/loras/{name} (admin keys).

POST reads files only inside the configured LoRA folders (`lora_dirs`, --lora-dir), its `path` relative to one
of them, and only after resolving symlinks and `..`: a path that is missing and one that leads outside get the
same answer, so the route tells nobody what else is on the server's disk. Files over max_lora_file_bytes and
layers over max_lora_rank are refused before they take memory on the device.

Loading reads the file and copies its low-rank weights on a worker thread, so the event loop keeps answering
and the device worker keeps stepping; running requests keep the adapters they started with (see lora.registry).
A deployment that fused its adapters into the weights at load (fuse_loras) lists them under `fused` and answers
409 to loading and unloading: the weights hold a fixed set, nothing can join or leave it at run time.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request

from vidloom.core.errors import CheckpointError
from vidloom.core.instance import ModelInstance
from vidloom.lora.registry import LORA_SLOT, attach_registry, check_lora_name
from vidloom.serving.api_keys import caller_of
from vidloom.serving.config import ServeConfig
from vidloom.serving.errors import APIError, echo, engine_errors, redact_paths
from vidloom.serving.protocol import LoraLoadBody, body_doc
from vidloom.serving.request_body import read_body
from vidloom.serving.video_routes import jobs_of

router = APIRouter()
MAX_LORA_PATH_CHARS = 1024  # a path relative to a LoRA folder; longer ones are refused unread


def served_instance(request: Request) -> Any | None:
    """The single-device engine's model instance; None for engines without one here (a multi-device pool)."""
    instance = jobs_of(request).engine.instance
    return instance if isinstance(instance, ModelInstance) else None


def served_registry(request: Request, create: bool = False) -> Any | None:
    """The served model's adapter registry: one device's (None until one is needed, unless `create`: then made,
    or InvalidRequest("lora") for a model without adapters), or a multi-device pool's, which loads and unloads
    on every rank."""
    engine = jobs_of(request).engine
    instance = served_instance(request)
    if instance is not None:
        return attach_registry(instance) if create else instance.components.get(LORA_SLOT)
    return getattr(getattr(engine, "engine", engine), "lora_registry", None)  # the AsyncEngine's ParallelEngine


def _refuse_if_fused(registry: Any | None, what: str) -> None:
    if registry is not None and registry.fused:
        names = ", ".join(f.name for f in registry.fused)
        raise APIError(409, f"fuse_loras: this deployment fused {names} into its weights at load; adapters cannot "
                       f"be {what} at run time (restart without --fuse-loras for run-time adapters)",
                       param="fuse_loras", code="loras_fused")


def adapter_list(registry: Any | None) -> list[dict[str, Any]]:
    """The resident adapters in load order: name and file name (the server's paths stay private, as in errors)."""
    return [] if registry is None else [{"name": a.name, "file": a.path.name} for a in registry.adapters]


@router.get("/v1/loras")
async def list_loras(request: Request) -> dict[str, Any]:
    registry = served_registry(request)
    fused = [] if registry is None else [{"name": f.name, "file": f.path.name, "scale": f.scale}
                                         for f in registry.fused]
    return {"object": "list", "data": adapter_list(registry), "fused": fused,
            "max_loras": registry.max_loras if registry is not None and not fused else None}


@router.post("/v1/loras", openapi_extra=body_doc(LoraLoadBody))
async def load_lora(request: Request) -> dict[str, Any]:
    _require_admin(request, "load")
    body = await read_body(request, LoraLoadBody)
    config: ServeConfig = request.app.state.config
    _refuse_if_fused(served_registry(request), "loaded")
    with engine_errors(lambda field: field):
        check_lora_name(body.name)
        registry = served_registry(request, create=True)
        path = await asyncio.to_thread(lora_file, body.path, config)
        try:
            adapter = await asyncio.to_thread(registry.load, body.name, path, body.into, config.max_lora_rank)
        except CheckpointError as exc:
            # The server's folders stay private: the file is named as the client named it.
            message = redact_paths(str(exc).replace(str(path), body.path))
            raise APIError(400, f"path: {message}", param="path", code="invalid_lora") from None
    return {"name": adapter.name, "file": adapter.path.name, "layers": adapter.layer_count}


@router.delete("/v1/loras/{name}")
async def unload_lora(request: Request, name: str) -> dict[str, Any]:
    _require_admin(request, "unload")
    registry = served_registry(request)
    _refuse_if_fused(registry, "unloaded")
    if registry is None or name not in registry.names:
        raise APIError(404, f"no LoRA adapter {echo(name)} is loaded", param="name", code="lora_not_found")
    with engine_errors(lambda field: field):
        await asyncio.to_thread(registry.unload, name)  # a pool's: one command on every rank, between two steps
    return {"name": name, "deleted": True}


def _require_admin(request: Request, what: str) -> None:
    if not caller_of(request.scope).admin:
        raise APIError(403, f"this API key may not {what} LoRA adapters (an admin key may)",
                       code="insufficient_permissions")


def lora_file(text: str, config: ServeConfig) -> Path:
    """The adapter file `text` names inside one of config.lora_dirs (symlinks and `..` resolved first), checked
    against max_lora_file_bytes. The same APIError for a missing file, a folder, and a path that leads outside
    every folder: the answer must not tell what exists elsewhere."""
    if not config.lora_dirs:
        raise APIError(403, "path: this server loads no LoRA files at run time; start it with --lora-dir DIR "
                       "(the folders POST /v1/loras may read from)", param="path", code="lora_dirs_unset")
    if len(text) > MAX_LORA_PATH_CHARS:
        raise APIError(400, f"path: longer than {MAX_LORA_PATH_CHARS} characters", param="path",
                       code="invalid_parameter")
    for folder in config.lora_dirs:
        try:
            root = folder.resolve()
            found = (root / text).resolve()
            if found.is_relative_to(root) and found.is_file():
                size = found.stat().st_size
                break
        except (OSError, ValueError, RuntimeError):  # a NUL byte, an over-long name, a symlink loop
            continue
    else:
        raise APIError(400, f"path: no LoRA file {echo(text)} in this server's LoRA folders (give a path "
                       "relative to a --lora-dir folder)", param="path", code="lora_file_not_found")
    if size > config.max_lora_file_bytes:
        raise APIError(400, f"path: {echo(text)} is {size} bytes, over this server's limit max_lora_file_bytes="
                       f"{config.max_lora_file_bytes}", param="path", code="lora_too_large")
    return found
