"""Continuation over HTTP: `POST /v1/videos` with `extend_from: <video id>` on a causal model.

A completed causal job keeps its final latents next to its mp4 (`<id>.latents`, safetensors,
removed with the job), so an extension can rebuild the source's KV after the runtime evicted
its resident session or the server restarted. The source is checked here, at the boundary:
unknown id 404, not completed 409, another model's video or a model that cannot extend 400,
each naming `extend_from`. Deleting a video releases its resident session at once.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from vidloom.core.errors import InvalidRequest
from vidloom.core.request import GenerationRequest, Task
from vidloom.media.request_inputs import resolve_request
from vidloom.core.session import EXTEND_FROM, VideoSession
from vidloom.media.atomic import atomic_path
from vidloom.runtime.cache_manager import CacheManager
from vidloom.serving.api_keys import OPEN, Caller
from vidloom.serving.errors import APIError, echo
from vidloom.serving.job_store import JobStore, is_job_id
from vidloom.serving.params import (
    PlannedVideo, check_model, choose_frames, format_seconds, new_video_id, parse_size, sampling_fields,
)
from vidloom.serving.protocol import VideoCreateBody

if TYPE_CHECKING:
    from vidloom.serving.jobs import JobManager

_MEDIA = ("input_reference", "video", "last_image")


def save_session(store: JobStore, job_id: str, session: VideoSession) -> None:
    """Write the job's latents atomically (before the job turns completed, like its mp4)."""
    with atomic_path(store.latents_path(job_id)) as tmp:
        session.save(tmp)


def release_session(caches: CacheManager | None, job_id: str) -> None:
    """Free the job's resident KV now (deleted, or its files could not be written)."""
    if caches is not None:
        caches.release_session(job_id)


async def expire_sessions(caches: CacheManager) -> None:
    """Until cancelled: drop sessions idle past the TTL within a tenth of it (at most 5 s late)."""
    period = min(5.0, max(0.05, caches.session_ttl_s / 10))
    while True:
        await asyncio.sleep(period)
        caches.expire()


def plan_extension(body: VideoCreateBody, manager: JobManager, caller: Caller = OPEN) -> PlannedVideo:
    """The extension's request, its source's session loaded; raises APIError / InvalidRequest naming extend_from.
    A source `caller` may not see is as unknown as a missing one."""
    card = manager.card
    check_model(body.model, card)
    for name in _MEDIA:
        if getattr(body, name) is not None:
            raise InvalidRequest(name, "cannot be combined with extend_from (the source video is the context)")
    session = _source(manager, getattr(body, EXTEND_FROM), caller)  # the served card's extension block's field
    width, height = parse_size(body.size, card) if body.size is not None else (None, None)
    fps = body.fps if body.fps is not None else session.fps
    frames = choose_frames(body, card, fps) if (body.num_frames, body.seconds) != (None, None) else None
    request = GenerationRequest(
        prompt=body.prompt, task=Task.T2V, height=height, width=width, num_frames=frames, fps=body.fps,
        request_id=new_video_id(), options={EXTEND_FROM: session}, **sampling_fields(body),
    )
    resolved = resolve_request(request, card)  # again at submit: here for the size and length the job shows
    assert resolved.num_frames and resolved.fps
    return PlannedVideo(request, f"{resolved.width}x{resolved.height}", format_seconds(resolved.num_frames, resolved.fps))


def _source(manager: JobManager, video_id: Any, caller: Caller) -> VideoSession:
    record = manager.get(video_id) if isinstance(video_id, str) and is_job_id(video_id) else None
    if record is None or not caller.sees(record.key_owner):
        raise APIError(404, f"extend_from: no video with id {echo(str(video_id))}", param=EXTEND_FROM,
                       code="video_not_found")
    if record.status != "completed":
        raise APIError(409, f"extend_from: video {record.id} is {record.status}; only a completed video can be "
                            "extended", param=EXTEND_FROM, code="video_not_ready")
    if record.model != manager.card.model_id:
        raise InvalidRequest(EXTEND_FROM, f"video {record.id} was made by {record.model}; this server serves "
                                          f"{manager.card.model_id}")
    try:
        return VideoSession.load(manager.store.latents_path(record.id))
    except FileNotFoundError:
        raise InvalidRequest(EXTEND_FROM, f"video {record.id} has no stored latents to continue from") from None
