"""The served model's request bodies: each route's general fields plus the card's options (serving.option_fields).

An option of a block the card lacks is refused by name with that block's reason, before any other check.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.routing import APIRoute
from pydantic import BaseModel

from vidloom import registry
from vidloom.core.card import ModelCard
from vidloom.core.errors import InvalidRequest
from vidloom.serving.errors import APIError
from vidloom.serving.option_fields import body_model
from vidloom.serving.protocol import body_doc
from vidloom.serving.request_body import read_body


def serve_options(app: FastAPI, card: ModelCard, routes: dict[str, type[BaseModel]]) -> None:
    """Each POST route path in `routes` reads its base body plus the card's options (read_options_body), and
    documents that body in /openapi.json."""
    bodies = {base: body_model(base, card) for base in routes.values()}
    app.state.option_bodies = bodies
    for route in app.routes:
        if isinstance(route, APIRoute) and route.path in routes and "POST" in route.methods:
            media = tuple(route.openapi_extra["requestBody"]["content"]) if route.openapi_extra else ()
            route.openapi_extra = body_doc(bodies[routes[route.path]], *media)


async def read_options_body(request: Request, base: type[BaseModel]) -> Any:
    """The body as `base` plus the served card's options (serve_options); another model's option is refused
    naming it, with the reason."""
    card = request.app.state.jobs.card
    return await read_body(request, request.app.state.option_bodies[base],
                           before=lambda data: refuse_foreign(data, base, card))


def refuse_foreign(data: dict[str, Any], base: type[BaseModel], card: ModelCard) -> None:
    """A 400 naming the first body key that is another model's option (not a field of `base`), with the reason."""
    try:
        registry.check_options([key for key in data if key not in base.model_fields], card)
    except InvalidRequest as exc:
        raise APIError(400, f"{exc.field}: {exc.message}", param=exc.field, code="invalid_parameter") from None
