"""`/v1/videos/{id}/prompt` (WebSocket): change a running chunked video's prompt from its next chunk on.

For models whose instance holds LivePrompts (Helios). The server first sends `{"type": "live", "id": ...}`; each
client text message `{"prompt": "..."}` is answered by `{"type": "prompt", "status": "pending"}` once it is queued
for the video's next chunk boundary (a later message replaces one not yet taken), or by `{"type": "error",
"field", "message"}` (a bad message, or a video not generating chunks now: queued, finished, or still encoding);
the socket stays usable either way. A model without live prompts, or a video the caller may not see, is refused
and the socket closed.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, WebSocket
from starlette.websockets import WebSocketDisconnect

from vidloom.core.errors import InvalidRequest
from vidloom.core.live_prompt import LIVE_PROMPTS, LivePrompts
from vidloom.serving.api_keys import caller_of
from vidloom.serving.job_store import is_job_id
from vidloom.serving.session_routes import (
    CLOSE_BAD_FORMAT, CLOSE_NOT_FOUND, SUBPROTOCOL, _error, _refuse, json_message,
)

router = APIRouter(prefix="/v1/videos")


@router.websocket("/{video_id}/prompt")
async def live_prompt(websocket: WebSocket, video_id: str) -> None:
    offered = websocket.scope.get("subprotocols") or []
    await websocket.accept(subprotocol=SUBPROTOCOL if SUBPROTOCOL in offered else None)
    manager = websocket.app.state.jobs
    prompts: LivePrompts | None = manager.engine.instance.components.get(LIVE_PROMPTS)
    if prompts is None:
        await _refuse(websocket, "model", f"{manager.card.model_id} takes no live prompt", CLOSE_BAD_FORMAT)
        return
    record = manager.get(video_id) if is_job_id(video_id) else None
    if record is None or not caller_of(websocket.scope).sees(record.key_owner):
        await _refuse(websocket, "video_id", "no video with this id", CLOSE_NOT_FOUND)
        return
    await websocket.send_json({"type": "live", "id": record.id})
    try:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                return
            try:
                prompt = parse_prompt(message)
                manager.limits.check_prompt("prompt", prompt)  # the bound a job's prompt has
            except InvalidRequest as exc:
                await _error(websocket, exc.field, exc.message)
                continue
            if prompts.set(record.id, prompt):
                await websocket.send_json({"type": "prompt", "status": "pending"})
            else:
                current = manager.get(record.id)
                status = current.status if current is not None else "deleted"
                await _error(websocket, "video_id", f"video {record.id} is {status} and not generating chunks "
                                                    "now; a prompt changes only between its chunks")
    except WebSocketDisconnect:
        return


def parse_prompt(message: dict[str, Any]) -> str:
    """A client message -> the new prompt; InvalidRequest naming the field."""
    data = json_message(message, "prompts", '{"prompt": "..."}', '{"prompt": "a paper boat"}')
    unknown = sorted(set(data) - {"prompt"})
    if unknown:
        raise InvalidRequest(unknown[0] or "message", "is not a live prompt message field; send only prompt")
    prompt = data.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise InvalidRequest("prompt", "must be non-empty text")
    return prompt
