"""The served model's request bodies: each route's general fields plus the card's options (serving.option_fields).

An option of a block the card lacks is refused by name with that block's reason, before any other check.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from pydantic import BaseModel

from vidloom import registry
from vidloom.core.card import ModelCard
from vidloom.core.errors import InvalidRequest
from vidloom.serving.errors import APIError
from vidloom.serving.option_fields import body_model
from vidloom.serving.protocol import body_doc
from vidloom.serving.request_body import read_body


def serve_options(app: FastAPI, card: ModelCard | None, routes: dict[str, type[BaseModel]]) -> None:
    """Each POST route path in `routes` reads its base body plus the card's options (read_options_body), and
    /openapi.json documents that body (card None: the base bodies)."""
    bodies = {base: base if card is None else body_model(base, card) for base in routes.values()}
    app.state.option_bodies = bodies
    generate = app.openapi  # the routers are shared by every app: this app's schema is patched, not the routes

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = generate()
            for path, base in routes.items():
                post = schema["paths"].get(path, {}).get("post", {})
                if "requestBody" in post:
                    post.update(body_doc(bodies[base], *post["requestBody"]["content"]))
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


async def read_options_body(request: Request, base: type[BaseModel]) -> Any:
    """The body as `base` plus the served card's options (serve_options); another model's option is refused
    naming it, with the reason."""
    card = request.app.state.jobs.card
    return await read_body(request, request.app.state.option_bodies[base],
                           before=lambda data: refuse_foreign(data, base, card))


def refuse_foreign(data: dict[str, Any], base: type[BaseModel], card: ModelCard) -> None:
    """A 400 naming the first body key that is another model's option (not a field of `base`), with the reason;
    one whose value means "not given" (null, false; a form's "false") is dropped instead."""
    foreign = {name for block, _ in registry.option_blocks().values() for name in block.names} - set(card.option_names)
    for key in [key for key in data if key in foreign and key not in base.model_fields]:
        if data[key] is None or data[key] is False or data[key] == "false":
            del data[key]  # an unknown key that is no option stays, for the body model to refuse
    try:
        registry.check_options([key for key in data if key not in base.model_fields], card)
    except InvalidRequest as exc:
        raise APIError(400, f"{exc.field}: {exc.message}", param=exc.field, code="invalid_parameter") from None
