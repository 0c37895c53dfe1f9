"""The FastAPI app: lifespan (job manager), guards and body limit, error handlers, and the small routes."""

from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager
from typing import AsyncIterator

from fastapi import APIRouter, FastAPI, Request, Response

from vidloom.runtime.engine import Engine
from vidloom.serving.chat_routes import ChatState, drain_chats
from vidloom.serving.chat_routes import router as chat_router
from vidloom.serving.config import ServeConfig
from vidloom.serving.errors import APIError, install_error_handlers
from vidloom.serving.guard import install_guards
from vidloom.serving.job_store import JobStore
from vidloom.serving.jobs import JobManager
from vidloom.serving.metrics import CONTENT_TYPE
from vidloom.serving.audio_routes import AudioGenerationBody
from vidloom.serving.audio_routes import router as audio_router
from vidloom.serving.image_routes import router as image_router
from vidloom.serving.lora_routes import adapter_list, served_instance, served_registry
from vidloom.serving.live_prompt_routes import router as live_prompt_router
from vidloom.serving.lora_routes import router as lora_router
from vidloom.serving.capabilities import ModelDetails, capabilities
from vidloom.serving.option_bodies import serve_options
from vidloom.serving.protocol import AdapterObject, ModelList, ModelObject, VideoCreateBody
from vidloom.serving.speech_routes import router as speech_router
from vidloom.serving.action_sessions import SessionManager
from vidloom.serving.session_routes import router as session_router
from vidloom.serving.ui_routes import ui_router
from vidloom.serving.video_routes import jobs_of
from vidloom.serving.video_routes import router as video_router

router = APIRouter()


def create_app(engine: Engine, config: ServeConfig, store: JobStore | None = None) -> FastAPI:
    """An app serving `engine`'s model; the job manager lives from lifespan start to end.

    `store`: an already opened and recovered job store (`vidloom serve` opens it before printing its
    address, so a bad database stops the start); None opens `config.data_dir` at lifespan start.
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.jobs = JobManager(engine, config, asyncio.get_running_loop(), store)
        app.state.jobs.start()
        app.state.chat = ChatState(app.state.jobs, config)
        app.state.sessions = SessionManager(app.state.jobs, max_sessions=config.slots + config.queue_size)
        app.state.started_at = int(time.time())
        try:
            yield
        finally:
            await app.state.sessions.close_all()
            await app.state.jobs.close()

    docs = config.enable_docs
    app = FastAPI(title="vidloom", version="0.1.0", lifespan=lifespan, docs_url="/docs" if docs else None,
                  redoc_url="/redoc" if docs else None, openapi_url="/openapi.json" if docs else None)
    app.state.config = config
    install_error_handlers(app)
    install_guards(app, config)  # Host, CORS, key/origin/type, body size
    app.include_router(video_router)
    app.include_router(image_router)
    app.include_router(audio_router)
    app.include_router(chat_router)
    app.include_router(speech_router)
    app.include_router(lora_router)
    app.include_router(session_router)
    app.include_router(live_prompt_router)
    app.include_router(router)
    if config.ui_enabled:
        app.include_router(ui_router())
    card = engine.card if engine is not None else None  # None: a schema-only app (tests)
    serve_options(app, card, {"/v1/videos": VideoCreateBody, "/v1/audio/generations": AudioGenerationBody})
    return app


async def drain(app: FastAPI) -> None:
    """Shutdown hook (server.GracefulServer): end jobs within the grace period so event streams close."""
    manager: JobManager | None = getattr(app.state, "jobs", None)
    if manager is not None:
        grace = app.state.config.graceful_shutdown_s
        await asyncio.gather(manager.drain(grace), drain_chats(app, grace))


@router.get("/health")
async def health(request: Request) -> dict[str, object]:
    """Answers from the event loop while the device worker renders: no model call, no I/O."""
    manager = jobs_of(request)
    return {"status": "ok", "model": manager.card.model_id,
            "queue_depth": manager.queue_depth, "in_flight": manager.in_flight}


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    return Response(jobs_of(request).metrics.exposition(), media_type=CONTENT_TYPE)


@router.get("/v1/models")
async def list_models(request: Request) -> ModelList:
    base = _model(request)
    adapters = [AdapterObject(id=a["name"], created=base.created, parent=base.id, root=a["file"])
                for a in adapter_list(served_registry(request))]
    return ModelList(data=[base, *adapters])


@router.get("/v1/models/{model_id:path}")
async def retrieve_model(request: Request, model_id: str) -> ModelDetails:
    """The model object plus `capabilities` (extension): what the card does, its defaults and this server's limits."""
    model = _model(request)
    if model_id != model.id:
        raise APIError(404, f"model {model_id!r} is not served here; this server serves {model.id!r}",
                       param="model", code="model_not_found")
    manager = jobs_of(request)
    instance = served_instance(request)
    caps = capabilities(manager.card, getattr(manager, "limits", None), manager.engine.program)
    return ModelDetails(**model.model_dump(), capabilities=caps,
                        accepted_config_keys=list(instance.accepted_config_keys) if instance is not None else [])


def _model(request: Request) -> ModelObject:
    return ModelObject(id=jobs_of(request).card.model_id, created=request.app.state.started_at)
