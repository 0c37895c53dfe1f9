"""Routes under /v1/videos: create, retrieve, list, content, delete, cancel and events (SSE).

A job belongs to the owner of the key that created it: other owners' keys (all but admin keys) find it as
they find a missing id (404), and list only their own (serving/api_keys.py).
"""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response, StreamingResponse

from vidloom.core.session import EXTEND_FROM
from vidloom.serving.action_results import ACTION_VARIANTS, actions_response
from vidloom.serving.api_keys import caller_of
from vidloom.serving.config import ServeConfig
from vidloom.serving.errors import APIError, echo, engine_errors, store_error
from vidloom.serving.file_response import OpenFileResponse
from vidloom.serving.job_store import STORE_ERRORS, JobRecord, UnknownCursor, is_job_id
from vidloom.serving.jobs import JobManager
from vidloom.serving.params import plan_resolved, plan_video
from vidloom.serving.protocol import VideoCreateBody, VideoDeleted, VideoList, VideoObject, body_doc
from vidloom.serving.option_bodies import read_options_body
from vidloom.serving.option_fields import http_options
from vidloom.serving.sse import job_events
from vidloom.serving.stream_route import stream_response
from vidloom.serving.video_sessions import plan_extension

router = APIRouter(prefix="/v1/videos")
AUDIO_JOB_SIZE = "0x0"  # an audio-only job's `size` (it has no frames): its content is variant=audio


def jobs_of(request: Request) -> JobManager:
    return request.app.state.jobs


def config_of(request: Request) -> ServeConfig:
    return request.app.state.config


@router.post("", openapi_extra=body_doc(VideoCreateBody, "application/json", "multipart/form-data"))
async def create_video(request: Request) -> VideoObject:
    """JSON or multipart (the openai client sends multipart); answers with the queued job."""
    manager = jobs_of(request)
    body = await read_options_body(request, VideoCreateBody)
    with engine_errors():
        if getattr(body, EXTEND_FROM, None) is not None:  # the extension block's field (causal models)
            planned = plan_extension(body, manager, caller_of(request.scope))
        elif _has_uploads(body) or _has_options(body, manager):  # uploads' headers, option parsers (a camera)
            planned = await manager.media.run(plan_resolved, body, manager.card, manager.limits.max_frames)
        else:
            planned = plan_video(body, manager.card, manager.limits.max_frames)
        record = manager.submit_video(planned, caller_of(request.scope).owner)
    return VideoObject.from_record(record)


@router.get("")
async def list_videos(
    request: Request,
    after: str | None = None,
    limit: int = Query(20, ge=1, le=100),
    order: Literal["asc", "desc"] = "desc",
) -> VideoList:
    caller = caller_of(request.scope)
    try:
        page = jobs_of(request).page(after, limit, order, None if caller.admin else caller.owner)
    except UnknownCursor:
        raise APIError(400, f"after: no video with id {echo(after)}", param="after", code="invalid_parameter") from None
    data = [VideoObject.from_record(r) for r in page.records]
    return VideoList(
        data=data, first_id=data[0].id if data else None, last_id=data[-1].id if data else None,
        has_more=page.has_more,
    )


@router.get("/{video_id}")
async def retrieve_video(request: Request, video_id: str) -> VideoObject:
    return VideoObject.from_record(_find(request, video_id))


@router.head("/{video_id}/content", include_in_schema=False)  # HEAD: the headers of the GET below
@router.get("/{video_id}/content")
async def download_content(
    request: Request, video_id: str, variant: str = "video"
) -> Response:
    """The mp4 (or a PNG of its first frame for variant=thumbnail); 409 until the job is completed.
    variant=stream (extension): a fragmented MP4 that grows while the job runs (see stream_route.py).
    variant=actions / actions_npy (extension): a world model's predicted actions (see action_results.py).
    variant=audio (extension): an audio-only job's WAV (POST /v1/audio/generations with background=true).

    The file is opened here and served from that handle, so a DELETE racing the download either
    comes first (404) or lets the whole file through; never a half-served file or a 500.
    """
    record = _find(request, video_id)
    if variant not in ("video", "thumbnail", "stream", "audio", *ACTION_VARIANTS):
        raise APIError(400, f"variant: {echo(variant)} is not available; use 'video', 'thumbnail', 'stream', "
                            "'audio', 'actions' or 'actions_npy'", param="variant", code="invalid_parameter")
    audio_only = record.size == AUDIO_JOB_SIZE
    if audio_only != (variant == "audio"):
        why = "this job is audio only: use variant=audio" if audio_only else "only audio-only jobs have variant=audio"
        raise APIError(400, f"variant: {why}", param="variant", code="invalid_parameter")
    if variant == "stream":
        return stream_response(request, jobs_of(request), record)
    if record.status != "completed":
        raise APIError(409, _not_ready(record), code="video_not_ready")
    store = jobs_of(request).store
    if variant in ACTION_VARIANTS:
        return actions_response(store.actions_path(video_id), variant, video_id, record.metadata)
    if variant == "thumbnail":
        path, media_type = store.thumbnail_path(video_id), "image/png"
    elif variant == "audio":
        path, media_type = store.audio_path(video_id), "audio/wav"
    else:
        path, media_type = store.video_path(video_id), "video/mp4"
    try:
        file = open(path, "rb")
    except FileNotFoundError:  # deleted between the lookup and now
        raise APIError(404, f"no video with id {video_id!r}", param="video_id", code="video_not_found") from None
    return OpenFileResponse(file, path, media_type=media_type, filename=f"{video_id}{path.suffix}")


@router.delete("/{video_id}")
async def delete_video(request: Request, video_id: str) -> VideoDeleted:
    """Cancels the job first if it is queued or running, then removes its row and files: both, or neither (503/507)."""
    _find(request, video_id)
    try:
        deleted = jobs_of(request).delete(video_id)
    except (OSError, *STORE_ERRORS) as exc:
        raise store_error(exc, f"video {video_id} was not deleted") from None
    if not deleted:
        raise APIError(404, f"no video with id {video_id!r}", param="video_id", code="video_not_found")
    return VideoDeleted(id=video_id)


@router.post("/{video_id}/cancel")
async def cancel_video(request: Request, video_id: str) -> VideoObject:
    """Extension. Queued jobs stop at once, running ones at their next step boundary."""
    record = _find(request, video_id)
    if record.status in ("completed", "failed"):
        raise APIError(409, f"video {video_id} already {record.status}; nothing to cancel", code="video_finished")
    record = await jobs_of(request).cancel(video_id) or record
    return VideoObject.from_record(record)


@router.get("/{video_id}/events")
async def video_events(request: Request, video_id: str) -> StreamingResponse:
    """Extension (SSE): current state, `progress` events, then one of completed / failed / cancelled."""
    manager = jobs_of(request)
    _find(request, video_id)
    subscription = manager.subscribe(video_id)
    if subscription is None:
        raise APIError(404, f"no video with id {echo(video_id)}", param="video_id", code="video_not_found")
    stream = job_events(manager, subscription, config_of(request).keepalive_s)
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(stream, media_type="text/event-stream", headers=headers)


def _has_uploads(body: VideoCreateBody) -> bool:
    return any(value is not None for value in (body.input_reference, body.last_image, body.video))


def _has_options(body: VideoCreateBody, manager: JobManager) -> bool:
    """Does the body set one of the card's option fields (their JSON text and parsers run on the media pool)?"""
    return any(getattr(body, option.name, None) not in (None, False) for option in http_options(manager.card))


def _find(request: Request, video_id: str) -> JobRecord:
    """The job `video_id` if the caller may see it; else the 404 of a missing id (no owner oracle)."""
    record = jobs_of(request).get(video_id) if is_job_id(video_id) else None
    if record is None or not caller_of(request.scope).sees(record.key_owner):
        raise APIError(404, f"no video with id {echo(video_id)}", param="video_id", code="video_not_found")
    return record


def _not_ready(record: JobRecord) -> str:
    if record.status in ("queued", "in_progress"):
        return (f"video {record.id} is {record.status} ({record.progress}%); "
                "its content is available once it is completed")
    return f"video {record.id} {record.status}; it has no content"
