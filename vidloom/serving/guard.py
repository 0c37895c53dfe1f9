"""Who may call the server: Host allow-list (DNS rebinding), API key, cross-origin writes, body content types.

Two ASGI middlewares around the app, outermost first:
`HostGuard` -> (Starlette's CORSMiddleware, only with --cors-origin) -> `RequestGuard` -> BodyLimit -> routes.
Each refusal is answered here, in the OpenAI error shape, before the request body is read; a refused
WebSocket handshake is closed before it is accepted (HTTP 403).
"""

from __future__ import annotations

import ipaddress
from urllib.parse import parse_qsl, urlsplit

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from vidloom.serving.api_keys import ANONYMOUS, CALLER_SCOPE_KEY, OPEN, Caller
from vidloom.serving.config import ServeConfig
from vidloom.serving.errors import echo, error_response
from vidloom.serving.request_body import BodyLimit
from vidloom.serving.ui_routes import UI_FILES

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
WILDCARD_BINDS = ("0.0.0.0", "::", "")
OPEN_PATHS = ("/health",)  # answer without a key: load balancers and liveness probes carry none
UI_PATHS = tuple(UI_FILES)  # the page and its files: open without the key (they hold no data)
DOCS_PATHS = ("/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json")
BODY_TYPES = ("application/json", "multipart/form-data")
_UNSAFE_METHODS = ("POST", "PUT", "PATCH", "DELETE")
_BODY_METHODS = ("POST", "PUT", "PATCH")


def host_name(header: str) -> str:
    """`Host` header value -> lowercase name without port: `[::1]:80` -> `::1`, `Example.com.:8000` -> `example.com`."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].split("]", 1)[0]
    if header.count(":") > 1:  # a bare IPv6 literal (no port can be told apart)
        return header
    return header.split(":", 1)[0].rstrip(".")


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


class HostGuard:
    """Refuse Host names that are not ours, the DNS-rebinding defence.

    A rebinding page reaches us under the attacker's domain name, so IP literals are always
    accepted (no rebinding can produce one); names must be loopback, the bind address, or listed.
    """

    def __init__(self, app: ASGIApp, config: ServeConfig) -> None:
        self.app = app
        self.any_host = "*" in config.allowed_hosts
        self.names = {*LOOPBACK_NAMES, config.host.lower(), *config.allowed_hosts} - set(WILDCARD_BINDS)

    def allows(self, header: str | None) -> bool:
        if header is None or self.any_host:  # HTTP/1.0 without Host: no browser sends that
            return True
        name = host_name(header)
        return name in self.names or _is_ip(name)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        header = _header(scope, b"host")
        if scope["type"] == "websocket":
            await (self.app(scope, receive, send) if self.allows(header) else _refuse_websocket(receive, send))
            return
        if self.allows(header):
            await self.app(scope, receive, send)
            return
        response = error_response(
            400, f"Host {echo(header)} is not served here; start the server with --allowed-host NAME to accept it",
            code="invalid_host",
        )
        await response(scope, receive, send)


class RequestGuard:
    """API key, then the Origin of state-changing requests, then the body's content type. The caller the key
    belongs to (api_keys.Caller) is left in the scope for the routes; without keys every caller is OPEN."""

    def __init__(self, app: ASGIApp, config: ServeConfig) -> None:
        self.app = app
        self.keys = config.key_ring
        self.open_paths = set(OPEN_PATHS)
        if not config.metrics_need_key:
            self.open_paths.add("/metrics")
        if config.ui_enabled:  # the playground's files hold no data; the page asks for the key itself
            self.open_paths.update(UI_PATHS)
        if config.enable_docs:  # the schema and docs pages hold no data; Swagger UI fetches them without a key
            self.open_paths.update(DOCS_PATHS)
        self.origins = set(config.cors_origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            caller = self.websocket_caller(scope)
            if caller is None:
                await _refuse_websocket(receive, send)
                return
            scope[CALLER_SCOPE_KEY] = caller
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self.refusal(scope)
        if refusal is None:
            scope[CALLER_SCOPE_KEY] = self._caller(scope) or ANONYMOUS  # an open path without a key
            await self.app(scope, receive, send)
            return
        status, message, code = refusal
        headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
        await error_response(status, message, code=code, headers=headers)(scope, receive, send)

    def refusal(self, scope: Scope) -> tuple[int, str, str] | None:
        """(status, message, code) for a request that must not reach the app; None to let it through."""
        method = scope["method"]
        if self.keys and scope["path"] not in self.open_paths and self._caller(scope) is None:
            return 401, _auth_message(_header(scope, b"authorization")), "invalid_api_key"
        if method in _UNSAFE_METHODS and not self._origin_allowed(scope):
            origin = _header(scope, b"origin")
            return (403, f"cross-origin request from {echo(origin)} refused; "
                    "start the server with --cors-origin ORIGIN to allow a web app", "origin_not_allowed")
        if method in _BODY_METHODS:
            return _content_type_refusal(scope)
        return None

    def websocket_caller(self, scope: Scope) -> Caller | None:
        """The caller of a WebSocket handshake; None to refuse it. A handshake is a GET that CORS never checks
        (cross-site WebSocket hijacking): its Origin must be allowed whatever the method, and its key may come as
        the header, `?api_key=` or the subprotocol `bearer.<key>` (a browser's WebSocket cannot send headers)."""
        if not self._origin_allowed(scope):
            return None
        if not self.keys:
            return OPEN
        offered = [_header(scope, b"authorization") or ""]
        offered += [f"Bearer {token.removeprefix('bearer.')}" for token in scope.get("subprotocols") or ()
                    if token.startswith("bearer.")]
        offered += [f"Bearer {value}" for name, value in parse_qsl(scope.get("query_string", b"").decode("latin-1"))
                    if name == "api_key"]
        return next((caller for value in offered if (caller := self._token_caller(value)) is not None), None)

    def admits_websocket(self, scope: Scope) -> bool:
        return self.websocket_caller(scope) is not None

    def _caller(self, scope: Scope) -> Caller | None:
        """The caller of an HTTP request: OPEN without keys, else the owner of the key it sent (None: no key)."""
        return self._token_caller(_header(scope, b"authorization") or "") if self.keys else OPEN

    def _token_caller(self, header: str) -> Caller | None:
        scheme, _, token = header.strip().partition(" ")
        if scheme.lower() != "bearer":
            return None
        return self.keys.caller(token.strip())

    def _origin_allowed(self, scope: Scope) -> bool:
        origin = _header(scope, b"origin")
        if origin is None:  # not a browser, or a same-origin GET-style navigation
            return True
        if "*" in self.origins or origin.rstrip("/") in self.origins:
            return True
        host = _header(scope, b"host")
        return host is not None and urlsplit(origin).netloc.lower() == host.strip().lower()  # same origin


async def _refuse_websocket(receive: Receive, send: Send) -> None:
    """Close the handshake before accepting it: the client sees HTTP 403 and no session is touched."""
    message = await receive()
    if message["type"] == "websocket.connect":
        await send({"type": "websocket.close", "code": 1008})


def _content_type_refusal(scope: Scope) -> tuple[int, str, str] | None:
    """Only JSON and multipart bodies: a cross-site HTML form can send urlencoded or text/plain without a preflight."""
    content_type = _header(scope, b"content-type")
    if content_type is None:
        has_body = _header(scope, b"transfer-encoding") is not None or (_header(scope, b"content-length") or "0") != "0"
        if not has_body:  # e.g. POST .../cancel with no body
            return None
        media = ""
    else:
        media = content_type.split(";", 1)[0].strip().lower()
        if media in BODY_TYPES:
            return None
    shown = echo(media) if media else "(none)"
    return (415, f"content type {shown} is not accepted; send application/json "
            "(curl: -H 'Content-Type: application/json') or multipart/form-data (curl -F)", "unsupported_media_type")


def _auth_message(header: str | None) -> str:
    if not header:
        return ("no API key provided; send it in an Authorization header using Bearer auth "
                "(Authorization: Bearer YOUR_KEY)")
    return "incorrect API key provided"  # never echo what was sent: it may be a real key for something else


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return value.decode("latin-1")
    return None


def install_guards(app: FastAPI, config: ServeConfig) -> None:
    """The middleware stack every server front runs (`vidloom serve` and the fleet ingress). add_middleware wraps:
    the last added runs first, so a request meets the Host check, CORS preflights (only with --cors-origin),
    key/origin/type, then the body size limit."""
    app.add_middleware(BodyLimit, max_bytes=config.max_body_bytes, timeout_s=config.body_timeout_s)
    app.add_middleware(RequestGuard, config=config)
    if config.cors_origins:
        app.add_middleware(
            CORSMiddleware, allow_origins=list(config.cors_origins), allow_methods=["GET", "POST", "DELETE"],
            allow_headers=["Authorization", "Content-Type"], max_age=600,
        )
    app.add_middleware(HostGuard, config=config)
