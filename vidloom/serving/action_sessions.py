"""World-model sessions over HTTP: the server side of `gen.open_session(...)`.

`POST /v1/sessions` opens one (a model's action session, e.g. Cosmos3's ActionSession, checked at the
boundary before any work); each chunk then runs as ordinary work on the engine (its slots, queue, admission
and limits, like an image call) through JobManager.generate_image, so the device worker alone touches the model.
A session holds its next conditioning frame here and its resident prompt prefixes in the engine's cache
manager under its id; both go when it is deleted, when its WebSocket disconnects, or when it has been idle for
the TTL (the deployment's kv_session_ttl_s, or IDLE_TTL_S when that is 0).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import time
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Counter, Gauge
from pydantic import ConfigDict

from vidloom.core import plugin
from vidloom.core.action import ActionInput
from vidloom.core.errors import InvalidRequest
from vidloom.runtime.interface import SessionHost
from vidloom.serving.api_keys import OPEN, Caller
from vidloom.serving.errors import APIError, echo
from vidloom.serving.params import check_model, sampling_fields
from vidloom.serving.protocol import ApiInt, SamplingExtensions

IDLE_TTL_S = 300.0  # a session's idle lifetime when the deployment keeps no KV sessions (kv_session_ttl_s = 0)
DATA_URL_PREFIX = "data:image/"


class SessionCreateBody(SamplingExtensions):
    """POST /v1/sessions (JSON, or a multipart form with the first frame as a file)."""

    model_config = ConfigDict(extra="forbid")

    prompt: str
    model: str | None = None
    input_reference: Any = None  # the first frame: an uploaded image file, or a data URL in JSON
    mode: str = "forward_dynamics"  # forward_dynamics (actions in, frames out) | policy (frames and actions out)
    domain_name: str
    chunk_size: ApiInt = 16
    view_point: str = "ego_view"
    resolution_tier: ApiInt = 480
    fps: ApiInt | None = None


@dataclass
class ServedSession:
    """One open session: the model's session object, one chunk at a time, and when it was last used."""

    rollout: Any  # the card's session class (ActionSession for Cosmos3): request(actions) / advance(output)
    created_at: int
    last_used: float
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    connected: bool = False  # a WebSocket is attached (one at a time)
    ended: asyncio.Event = field(default_factory=asyncio.Event)  # set when closed or expired
    end_reason: str = "closed"  # deleted | expired | closed (its WebSocket went away, or the server stops)
    key_owner: str | None = None  # the owner of the API key that opened it: only its keys (and admins) see it

    @property
    def id(self) -> str:
        return self.rollout.session_id

    def describe(self) -> dict[str, Any]:
        block = self.rollout.action
        return {"id": self.id, "object": "session", "created_at": self.created_at, "prompt": self.rollout.prompt,
                "mode": block.mode, "domain_name": block.domain_name, "chunk_size": block.chunk_size,
                "view_point": block.view_point, "resolution_tier": block.resolution_tier, "seed": self.rollout.seed,
                "chunks": self.rollout.index, "connected": self.connected}


class SessionManager:
    """The open sessions of one server, at most `max_sessions`; idle ones close after `ttl_s`."""

    def __init__(self, jobs: Any, max_sessions: int) -> None:
        self.jobs = jobs  # the JobManager: card, limits, media pool, and the engine the chunks run on
        self.caches = jobs.engine.caches
        self.ttl_s = self.caches.session_ttl_s if self.caches is not None and self.caches.session_ttl_s > 0 \
            else IDLE_TTL_S
        self.max_sessions = max_sessions
        # The session's chunks are submitted to the engine by `step` (never run in the session's own thread).
        self._host = SessionHost(jobs.card, self.caches)
        self._sessions: dict[str, ServedSession] = {}
        self._expirer: asyncio.Task[None] | None = None
        Gauge("vidloom_world_sessions", "Open world-model sessions (POST /v1/sessions)",
              registry=jobs.metrics.registry).set_function(lambda: len(self._sessions))
        self._expired = Counter("vidloom_world_sessions_expired", "World-model sessions closed after their idle TTL",
                                registry=jobs.metrics.registry)

    def __len__(self) -> int:
        return len(self._sessions)

    async def open(self, body: SessionCreateBody, key_owner: str | None = None) -> ServedSession:
        """Check and open a session of `key_owner` (400 naming the field, 429 when at max_sessions); runs no
        chunk yet."""
        card = self.jobs.card
        check_model(body.model, card)
        spec = card.request_blocks.get("action")
        if spec is None or spec.session is None or self.caches is None:
            raise InvalidRequest("model", f"{card.model_id} has no action pathway to open a session on")
        if body.input_reference is None:
            raise InvalidRequest("input_reference", "a session starts from a first frame: upload one or send a "
                                                    "data URL (data:image/png;base64,...)")
        self._check_room()
        image = await self.jobs.media.run(first_frame, body.input_reference)
        self._check_room()  # again: other opens may have landed while the frame was checked
        block = ActionInput(mode=body.mode, domain_name=body.domain_name, chunk_size=body.chunk_size,
                            view_point=body.view_point, resolution_tier=body.resolution_tier)
        fields = {k: v for k, v in sampling_fields(body).items() if v is not None and v != ()}
        if body.fps is not None:
            fields["fps"] = body.fps
        opener = plugin.resolve(spec.session)
        rollout = opener(self._host, body.prompt, image=image, action=block, **fields)
        try:
            self.jobs.limits.check(rollout.sample_request(), self.jobs.engine.estimator)
        except BaseException:
            rollout.close()
            raise
        session = ServedSession(rollout, int(time.time()), time.monotonic(), key_owner=key_owner)
        self._sessions[session.id] = session
        if self._expirer is None:
            self._expirer = asyncio.get_running_loop().create_task(self._expire_loop())
        return session

    def _check_room(self) -> None:
        if len(self._sessions) >= self.max_sessions:
            raise APIError(429, f"{len(self._sessions)} sessions are open, this server's limit; close one "
                           "(DELETE /v1/sessions/{id}) or wait for an idle one to expire", code="too_many_sessions",
                           headers={"Retry-After": str(int(self.ttl_s))})

    def find(self, session_id: str, caller: Caller = OPEN) -> ServedSession | None:
        """The open session `session_id` if `caller` may see it (another owner's is as unknown as a missing one)."""
        session = self._sessions.get(session_id)
        return session if session is not None and caller.sees(session.key_owner) else None

    def get(self, session_id: str, caller: Caller = OPEN) -> ServedSession:
        session = self.find(session_id, caller)
        if session is None:
            raise APIError(404, f"no open session {echo(session_id)} (closed, expired or never opened)",
                           param="session_id", code="session_not_found")
        return session

    async def step(self, session: ServedSession, actions: Any) -> Any:
        """Run the session's next chunk on the engine; InvalidRequest (naming the field) leaves it unchanged."""
        async with session.lock:
            session.last_used = time.monotonic()
            request = session.rollout.request(actions)
            try:  # generate_image checks the server's limits and queues it like any request
                output = await self.jobs.generate_image(request, kind="session_chunk")
            finally:
                session.last_used = time.monotonic()
            return session.rollout.advance(output)

    def close(self, session_id: str, reason: str = "closed") -> bool:
        """Free the session now (its frame here, its prefixes in the cache manager); False if it was not open."""
        session = self._sessions.pop(session_id, None)
        if session is None:
            return False
        session.rollout.close()
        session.end_reason = reason
        session.ended.set()
        return True

    def expire(self) -> list[str]:
        """Close sessions idle past the TTL (a chunk in progress is not idle)."""
        now = time.monotonic()
        idle = [s.id for s in self._sessions.values() if not s.lock.locked() and now - s.last_used > self.ttl_s]
        for session_id in idle:
            self.close(session_id, "expired")
        self._expired.inc(len(idle))
        return idle

    async def close_all(self) -> None:
        if self._expirer is not None:
            self._expirer.cancel()
        for session_id in list(self._sessions):
            self.close(session_id)

    async def _expire_loop(self) -> None:
        """Until cancelled: close idle sessions within a tenth of the TTL (at most 5 s late)."""
        while True:
            await asyncio.sleep(min(5.0, max(0.05, self.ttl_s / 10)))
            self.expire()


def first_frame(value: Any) -> Any:
    """The session's first frame from an upload (bytes) or a data URL, checked from its header (400 naming
    input_reference); runs on the media pool, never on the event loop."""
    from vidloom.media.image import open_image

    if isinstance(value, str):
        head, sep, payload = value.partition(",")
        if not value.startswith(DATA_URL_PREFIX) or not sep or not head.endswith(";base64"):
            raise InvalidRequest("input_reference", "must be an uploaded image file or a base64 data URL "
                                                    "(data:image/png;base64,...)")
        try:
            value = base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidRequest("input_reference", "the data URL's base64 payload does not decode") from None
    if not isinstance(value, (bytes, bytearray)):
        raise InvalidRequest("input_reference", "must be an uploaded image file or a data URL")
    return open_image(bytes(value), "input_reference")

