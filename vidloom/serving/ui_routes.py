"""The web playground: one HTML page, its scripts (one per kind of work), one stylesheet, shipped in the package
(no build step, no CDN).

The page is a client of the public API and nothing more; it is served without the API key (it holds no data)
and asks for the key itself when the server has one. Routes exist only when ServeConfig.ui_enabled.
"""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter
from fastapi.responses import Response

# path -> (file in vidloom/serving/ui, media type)
UI_FILES = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/ui/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/ui/app.css": ("app.css", "text/css; charset=utf-8"),
    "/ui/world.js": ("world.js", "text/javascript; charset=utf-8"),
    "/ui/audio.js": ("audio.js", "text/javascript; charset=utf-8"),
    "/ui/camera.js": ("camera.js", "text/javascript; charset=utf-8"),
    "/ui/chat.js": ("chat.js", "text/javascript; charset=utf-8"),
    "/ui/snippet.js": ("snippet.js", "text/javascript; charset=utf-8"),
}
# Everything from this server only: no inline script, no third-party origin. blob: carries media the page
# fetched with the API key (a <video src> cannot send an Authorization header); data: the images API's b64_json.
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; connect-src 'self'; "
       "img-src 'self' blob: data:; media-src 'self' blob:; object-src 'none'; base-uri 'none'; "
       "form-action 'none'; frame-ancestors 'none'")
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache",
           "Referrer-Policy": "no-referrer"}


def ui_router() -> APIRouter:
    """The files, read once (a wheel install has them as package data)."""
    router = APIRouter(include_in_schema=False)
    folder = resources.files("vidloom.serving") / "ui"
    for path, (name, media_type) in UI_FILES.items():
        router.add_api_route(path, _responder(folder.joinpath(name).read_bytes(), media_type), methods=["GET"])
    return router


def _responder(body: bytes, media_type: str):  # type: ignore[no-untyped-def]
    async def serve() -> Response:
        return Response(body, media_type=media_type, headers=HEADERS)

    return serve
