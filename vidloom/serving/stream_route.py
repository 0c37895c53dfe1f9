"""GET /v1/videos/{id}/content?variant=stream: the video as a fragmented MP4 that grows while the job runs.

- Running (or queued) on this server: a chunked response that follows the job's stream file as chunks
  are decoded and ends when the job ends. Completed: every fragment, then the end. Failed or
  cancelled: it ends after the last whole fragment (a playable prefix). A model that produces the
  whole video at once (Wan) sends nothing until it completes, then the finished mp4.
- Completed: the job's stream file (or, for a model without chunks, its mp4) as a plain download.
- Failed or cancelled: 409, as for the plain content.
- Running on another server of a shared job store: 409; that server streams it, and this one serves
  it once it completed.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from vidloom.serving.chunk_stream import stream_body
from vidloom.serving.errors import APIError
from vidloom.serving.file_response import OpenFileResponse
from vidloom.serving.job_store import JobRecord
from vidloom.serving.jobs import JobManager

STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def stream_response(request: Request, manager: JobManager, record: JobRecord) -> Response:
    job_id = record.id
    if record.status == "completed":
        return _finished_file(manager, job_id)
    if record.finished:
        raise APIError(409, f"video {job_id} {record.status}; it has no content", code="video_not_ready")
    streams = getattr(manager, "streams", None)  # a fleet's ingress (FleetJobs) runs no jobs, so has none
    stream = streams.get(job_id) if streams is not None else None
    if stream is None:
        raise APIError(409, f"video {job_id} is {record.status} on another server, which serves its live stream; "
                            "here it is available once completed", code="video_not_ready")
    if request.method == "HEAD":
        return Response(media_type="video/mp4", headers=STREAM_HEADERS)
    body = stream_body(stream, lambda: completed_file(manager, job_id))
    return StreamingResponse(body, media_type="video/mp4", headers=STREAM_HEADERS)


def completed_file(manager: JobManager, job_id: str) -> Path | None:
    """The completed job's stream file, or its mp4 when it has none; None unless it completed."""
    record = manager.get(job_id)
    if record is None or record.status != "completed":
        return None
    stream = manager.store.stream_path(job_id)
    return stream if stream.exists() else manager.store.video_path(job_id)


def _finished_file(manager: JobManager, job_id: str) -> OpenFileResponse:
    path = completed_file(manager, job_id)
    try:
        file = open(path, "rb") if path is not None else None
    except FileNotFoundError:  # deleted between the lookup and now
        file = None
    if file is None or path is None:
        raise APIError(404, f"no video with id {job_id!r}", param="video_id", code="video_not_found")
    return OpenFileResponse(file, path, media_type="video/mp4", filename=f"{job_id}.mp4")
