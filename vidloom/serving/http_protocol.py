"""uvicorn's h11 protocol with a header deadline and a connection cap that never locks out liveness probes.

Header deadline: uvicorn arms its keep-alive timer only after a response and cancels it on any
received byte, so a client sending one header line every few seconds (slowloris) holds its socket
forever. This protocol closes such a connection when the head is not complete in time: on a new
connection, and again at the start of each keep-alive request.

Connection cap: uvicorn's `limit_concurrency` answers *every* request with 503 once the cap is
reached, /health included, so a few hundred idle sockets make a liveness probe fail. Here, when a
new connection would pass `max_connections`, the connection that has waited longest for a request
head is closed instead (an idle or slow client yields its place to one that speaks); only when
every connection is busy with a request does the new one land in a reserve of `probe_connections`
that answers /health and /metrics only (503 for the rest); past the reserve it gets a 503 and is
closed. An optional second listener (`health_port`) serves /health and /metrics alone, with its
own cap, so probes on it never compete with API clients at all.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

import h11
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from vidloom.serving.errors import error_response

PROBE_PATHS = ("/health", "/metrics")  # what liveness probes and scrapers call


@dataclass(frozen=True)
class ConnectionLimits:
    """A server's connection settings (ServeConfig's, with the health listener's bound port)."""

    header_timeout_s: float = 10.0
    max_connections: int = 256  # API connections
    probe_connections: int = 16  # reserve on the API port for /health and /metrics; the health port's cap
    health_port: int | None = None  # the bound port of the probe-only listener, if any


class ProbesOnly:
    """An app wrapper that answers /health and /metrics and refuses every other path with `status`."""

    def __init__(self, app: ASGIApp, status: int, message: str) -> None:
        self.app, self.status, self.message = app, status, message

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in PROBE_PATHS:
            await self.app(scope, receive, send)
            return
        # 503: close too, so the client's retry opens a new connection, which gets a full place once one frees.
        headers = {"Retry-After": "1", "Connection": "close"} if self.status == 503 else None
        code = "server_busy" if self.status == 503 else "not_found"
        await error_response(self.status, self.message, code=code, headers=headers)(scope, receive, send)


def _refusal(max_connections: int) -> bytes:
    body = json.dumps({"error": {
        "message": f"the server has {max_connections} connections open (max_connections); retry later",
        "type": "server_error", "param": None, "code": "server_busy"}}).encode()
    head = (f"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            "retry-after: 1\r\nconnection: close\r\n\r\n")
    return head.encode() + body


class GuardedProtocol(H11Protocol):
    """H11Protocol plus `limits` (set per server by `protocol_class`)."""

    limits: ConnectionLimits = ConnectionLimits()
    _deadline: asyncio.TimerHandle | None = None
    _waiting_since: float = 0.0  # when this connection began waiting for a request head
    probe_listener: bool = False  # accepted on the health port

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        port = self.server[1] if self.server else None
        self.probe_listener = self.limits.health_port is not None and port == self.limits.health_port
        if self.probe_listener:
            self.app = ProbesOnly(self.app, 404, "this port serves /health and /metrics only")
        self._arm()
        self._admit()

    def _admit(self) -> None:
        """Keep this listener's connections within its cap (see the module docstring)."""
        limits = self.limits
        # Connections already closing (evicted by a newcomer earlier in this loop turn) hold no place.
        peers = [p for p in self.connections if p is not self and not p.transport.is_closing()
                 and getattr(p, "probe_listener", False) is self.probe_listener]
        cap = limits.probe_connections if self.probe_listener else limits.max_connections
        if len(peers) < cap:
            return
        waiting = [p for p in peers if isinstance(p, GuardedProtocol) and p.waiting_for_head()]
        if waiting:
            oldest = min(waiting, key=lambda p: p._waiting_since)
            self.logger.info("connection cap (%d) reached: closing the connection idle longest", cap)
            oldest.transport.close()
            return
        if not self.probe_listener and len(peers) < cap + limits.probe_connections:
            self.app = ProbesOnly(self.app, 503, f"the server has {cap} connections busy (max_connections); "
                                  "only /health and /metrics are answered now; retry later")
            return
        self.transport.write(_refusal(cap))
        self.transport.close()

    def waiting_for_head(self) -> bool:
        """Between requests or before the first: nothing in progress would be lost by closing it."""
        idle = self.cycle is None or self.cycle.response_complete
        return idle and self.conn.their_state is h11.IDLE and not self.transport.is_closing()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:  # the request head is complete (or the connection broke)
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            self._arm()  # the next request on this keep-alive connection gets its own deadline

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._waiting_since = time.monotonic()  # not loop.time(): uvloop's is cached per loop turn (ms ties)
        self._deadline = self.loop.call_later(self.limits.header_timeout_s, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.logger.info("closing a connection whose request head did not arrive within %gs",
                             self.limits.header_timeout_s)
            self.transport.close()


def protocol_class(limits: ConnectionLimits) -> type[GuardedProtocol]:
    """A protocol class for uvicorn's `http=` setting with these limits."""
    return type("GuardedProtocol", (GuardedProtocol,), {"limits": limits})
