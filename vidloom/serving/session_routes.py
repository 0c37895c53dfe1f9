"""Routes under /v1/sessions: open, describe and close a world-model session, and drive it over a WebSocket.

WebSocket protocol (`/v1/sessions/{id}/ws`, documented in docs/world-models-cosmos3.md): the server first sends
`{"type": "session", ...}`; each client text message `{"actions": [[...], ...]}` (forward_dynamics; policy sends
`{}`) runs the next chunk and is answered by a JSON header `{"type": "chunk", "index", "frames", "width",
"height", "format"[, "actions"]}` followed by `frames` binary messages, one image each (JPEG by default,
`?format=png` for lossless frames). A bad message gets `{"type": "error", "field", "message"}` and the session
stays usable. The session is closed when the socket disconnects (a chunk in progress is cancelled first), on
DELETE, or when idle past the TTL (`{"type": "closed", "reason": "expired"}`, close code 4408).
"""

from __future__ import annotations

import asyncio
import io
import json
import math
from typing import Any

from fastapi import APIRouter, Request, WebSocket
from starlette.websockets import WebSocketDisconnect

from vidloom.core.errors import Cancelled, InvalidRequest, VidloomError
from vidloom.serving.action_sessions import SessionCreateBody, SessionManager
from vidloom.serving.api_keys import caller_of
from vidloom.serving.errors import APIError, engine_errors, redact_paths
from vidloom.serving.protocol import body_doc
from vidloom.serving.request_body import check_text_fields, read_body

router = APIRouter(prefix="/v1/sessions")
FRAME_FORMATS = {"jpeg": "JPEG", "png": "PNG"}
JPEG_QUALITY = 90
MAX_MESSAGE_CHARS = 1 << 20  # an action chunk is a few hundred numbers; refuse megabytes of text
SUBPROTOCOL = "vidloom"  # a browser that sends its key as the subprotocol `bearer.<key>` also offers this one
CLOSE_EXPIRED, CLOSE_NOT_FOUND, CLOSE_BUSY, CLOSE_BAD_FORMAT = 4408, 4404, 4409, 4400


def sessions_of(app: Any) -> SessionManager:
    return app.state.sessions


def _session_fields(field: str) -> str:
    return {"image": "input_reference", "action.domain_name": "domain_name", "action.mode": "mode",
            "action.chunk_size": "chunk_size", "action.view_point": "view_point",
            "action.resolution_tier": "resolution_tier", "action": "model"}.get(field, field)


@router.post("", openapi_extra=body_doc(SessionCreateBody, "application/json", "multipart/form-data"))
async def open_session(request: Request) -> dict[str, Any]:
    """JSON (the first frame as a data URL) or multipart (as a file); answers with the session object."""
    body = await read_body(request, SessionCreateBody)
    with engine_errors(_session_fields):
        session = await sessions_of(request.app).open(body, caller_of(request.scope).owner)
    return session.describe()


@router.get("/{session_id}")
async def get_session(request: Request, session_id: str) -> dict[str, Any]:
    return sessions_of(request.app).get(session_id, caller_of(request.scope)).describe()


@router.delete("/{session_id}")
async def delete_session(request: Request, session_id: str) -> dict[str, Any]:
    manager = sessions_of(request.app)
    session = manager.get(session_id, caller_of(request.scope))
    if session.lock.locked():  # a chunk is running: stop it at its next step boundary first
        manager.jobs.engine.cancel(session_id)
        async with session.lock:
            pass
    manager.close(session_id, "deleted")
    return {"id": session_id, "object": "session.deleted", "deleted": True}


@router.websocket("/{session_id}/ws")
async def drive_session(websocket: WebSocket, session_id: str, format: str = "jpeg") -> None:
    manager = sessions_of(websocket.app)
    offered = websocket.scope.get("subprotocols") or []
    await websocket.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in offered else None)
    session = manager.find(session_id, caller_of(websocket.scope))  # another owner's: as if never opened
    if format not in FRAME_FORMATS:
        await _refuse(websocket, "format", f"must be one of {', '.join(FRAME_FORMATS)}", CLOSE_BAD_FORMAT)
        return
    if session is None:
        await _refuse(websocket, "session_id", "no open session with this id", CLOSE_NOT_FOUND)
        return
    if session.connected:
        await _refuse(websocket, "session_id", "another WebSocket drives this session", CLOSE_BUSY)
        return
    session.connected = True
    try:
        await websocket.send_json({"type": "session", **session.describe()})
        await _serve(websocket, manager, session, format)
    finally:
        session.connected = False
        manager.close(session_id)  # disconnect, expiry or DELETE: nothing of the session stays


async def _serve(websocket: WebSocket, manager: SessionManager, session: Any, fmt: str) -> None:
    ended = asyncio.ensure_future(session.ended.wait())
    pending: asyncio.Future[Any] | None = None
    try:
        while True:
            pending = pending or asyncio.ensure_future(websocket.receive())
            await asyncio.wait({pending, ended}, return_when=asyncio.FIRST_COMPLETED)
            if not pending.done():
                await _closed(websocket, session.end_reason)
                return
            message, pending = pending.result(), None
            if message["type"] == "websocket.disconnect":
                return
            try:
                actions = parse_message(message)
            except InvalidRequest as exc:
                await _error(websocket, exc.field, exc.message)
                continue
            step = asyncio.ensure_future(manager.step(session, actions))
            pending = asyncio.ensure_future(websocket.receive())  # a disconnect while the chunk runs
            await asyncio.wait({step, pending}, return_when=asyncio.FIRST_COMPLETED)
            if pending.done() and pending.result()["type"] == "websocket.disconnect":
                manager.jobs.engine.cancel(session.id)  # stop at the next step boundary, then free everything
                await asyncio.gather(step, return_exceptions=True)
                return
            chunk = await _finish(websocket, step)
            if chunk is not None:
                await _send_chunk(websocket, manager, session, chunk, fmt)
    except WebSocketDisconnect:
        return
    finally:
        for task in (ended, pending):
            if task is not None and not task.done():
                task.cancel()


async def _finish(websocket: WebSocket, step: asyncio.Future[Any]) -> Any:
    """The chunk, or None after telling the client why it did not run (the session stays at its last chunk)."""
    try:
        return await step
    except InvalidRequest as exc:
        await _error(websocket, _message_field(exc.field), exc.message)
    except Cancelled as exc:
        await _error(websocket, "session", f"the chunk was cancelled: {exc}")
    except APIError as exc:
        await _error(websocket, exc.param or "session", exc.message)
    except VidloomError as exc:  # EngineBusy (queue full), a failed run: the client may retry the chunk
        await _error(websocket, "session", redact_paths(str(exc)))
    return None


async def _send_chunk(websocket: WebSocket, manager: SessionManager, session: Any, chunk: Any, fmt: str) -> None:
    frames = chunk.frames
    header: dict[str, Any] = {"type": "chunk", "index": chunk.index, "frames": int(frames.shape[0]),
                              "height": int(frames.shape[1]), "width": int(frames.shape[2]), "format": fmt}
    if chunk.actions is not None:
        header["actions"] = chunk.actions.tolist()
    images = await manager.jobs.media.run(encode_frames, frames, fmt)
    await websocket.send_json(header)
    for data in images:
        await websocket.send_bytes(data)


def encode_frames(frames: Any, fmt: str = "jpeg") -> list[bytes]:
    """uint8 [N, H, W, 3] -> one JPEG (quality JPEG_QUALITY) or PNG per frame; runs on the media pool."""
    from PIL import Image

    out = []
    for frame in frames:
        buf = io.BytesIO()
        options = {"quality": JPEG_QUALITY, "subsampling": 0} if fmt == "jpeg" else {}  # 4:4:4: thin edges keep colour
        Image.fromarray(frame).save(buf, format=FRAME_FORMATS[fmt], **options)
        out.append(buf.getvalue())
    return out


def parse_message(message: dict[str, Any]) -> Any:
    """A client message -> the chunk's actions (None: the model predicts them); InvalidRequest naming the field.
    The width per domain and the chunk rules are the model's to check (ActionSession.request)."""
    data = json_message(message, "action chunks", '{"actions": [[...], ...]}', '{"actions": [[0.1, 0.2], ...]}')
    unknown = sorted(set(data) - {"actions"})
    if unknown and unknown[0] == "":  # sorted first; named as such, not as a blank field
        raise InvalidRequest("message", '(empty field name) "" is not a session message field; send only actions')
    if unknown:
        raise InvalidRequest(unknown[0], "is not a session message field; send only actions")
    actions = data.get("actions")
    if actions is None:
        return None
    if not isinstance(actions, list) or not actions or not all(isinstance(row, list) and row for row in actions):
        raise InvalidRequest("actions", "must be a non-empty list of rows [[a0, a1, ...], ...]")
    width = len(actions[0])
    for i, row in enumerate(actions):
        if len(row) != width:
            raise InvalidRequest(f"actions[{i}]", f"has {len(row)} numbers; row 0 has {width}")
        for value in row:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not _finite(value):
                raise InvalidRequest(f"actions[{i}]", f"must hold finite numbers, got {str(value)[:20]!r}")
    return actions


def json_message(message: dict[str, Any], what: str, shape: str, example: str) -> dict[str, Any]:
    """A client WebSocket message -> its JSON object (`what` it carries, its `shape` and an `example` for the
    errors); InvalidRequest naming the field, under the HTTP bodies' text rules."""
    text = message.get("text")
    if text is None:
        raise InvalidRequest("message", f"send {what} as JSON text messages, not binary")
    if len(text) > MAX_MESSAGE_CHARS:
        raise InvalidRequest("message", f"is {len(text)} characters, more than {MAX_MESSAGE_CHARS}")
    try:
        data = json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError):
        raise InvalidRequest("message", f"is not JSON; send {shape}") from None
    if not isinstance(data, dict):
        raise InvalidRequest("message", f"must be a JSON object such as {example}")
    try:
        check_text_fields(data)  # the HTTP bodies' text rules: no lone surrogate to echo back, no NUL
    except APIError as exc:
        field = exc.param if exc.param not in (None, "body") else "message"
        raise InvalidRequest(field, exc.message.partition(": ")[2] or exc.message) from None
    return data


def _finite(value: int | float) -> bool:
    """A JSON number a float holds finitely (HTTP's float fields refuse the rest alike); a 400-digit integer
    overflows math.isfinite."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _message_field(field: str) -> str:
    return "actions" if field == "action.raw_actions" else field


async def _error(websocket: WebSocket, field: str, message: str) -> None:
    await websocket.send_json({"type": "error", "field": field, "message": f"{field}: {message}"})


async def _closed(websocket: WebSocket, reason: str) -> None:
    """The session ended under the socket (expired, deleted, the server stops): say why, then close."""
    try:
        await websocket.send_json({"type": "closed", "reason": reason})
        await websocket.close(code=CLOSE_EXPIRED if reason == "expired" else 1000)
    except (WebSocketDisconnect, RuntimeError):
        pass


async def _refuse(websocket: WebSocket, field: str, message: str, code: int) -> None:
    await _error(websocket, field, message)
    await websocket.close(code=code)
