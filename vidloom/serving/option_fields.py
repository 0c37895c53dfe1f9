"""The served model's option blocks (core.options) as HTTP body fields.

A route's body model is its general fields plus one field per option of the served card's blocks, typed by
the option's kind and documented by its help, so /openapi.json shows exactly this model's options
(serving.option_bodies installs the bodies on the app and refuses another model's options).
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, Field, create_model

from vidloom.core.card import ModelCard
from vidloom.core.errors import InvalidRequest
from vidloom.core.options import Option
from vidloom.serving.protocol import ActionBlock, ApiBool, ApiFloat, ApiInt, _json_text

# The one option whose HTTP shape is a typed object of its own (validated field by field, named action.mode...).
_OBJECT_TYPES: dict[str, Any] = {"action": Annotated[ActionBlock | None, BeforeValidator(_json_text)]}
_KIND_TYPES: dict[str, Any] = {"float": ApiFloat | None, "int": ApiInt | None, "bool": ApiBool, "str": str | None,
                               "array": Any, "json": Any}


def body_model(base: type[BaseModel], card: ModelCard) -> type[BaseModel]:
    """`base` plus the card's HTTP options (those `base` already has keep its own field)."""
    fields: dict[str, Any] = {}
    for option in http_options(card):
        if option.name not in base.model_fields:
            annotation = _OBJECT_TYPES.get(option.name, _KIND_TYPES[option.kind])
            fields[option.name] = (annotation, Field(default=option.default, description=option.help))
    if not fields:
        return base
    return create_model(base.__name__, __base__=base, __doc__=base.__doc__, **fields)


def http_options(card: ModelCard) -> list[Option]:
    return [option for spec in card.request_blocks.values() for option in spec.block.options if option.http]


def option_values(body: BaseModel, card: ModelCard) -> dict[str, Any]:
    """The card's options the body gives (a form's array and JSON values arrive as text: parsed here)."""
    values: dict[str, Any] = {}
    for option in http_options(card):
        value = getattr(body, option.name, None)
        if value is None or value is False:
            continue
        if isinstance(value, BaseModel):
            value = value.model_dump()
        elif option.kind in ("array", "json"):
            value = _json_value(option, value)
        values[option.name] = value
    return values


def _json_value(option: Option, value: object) -> object:
    """A JSON value as sent in a JSON body, or as text in a multipart form; shapes are checked with the request."""
    what = "a JSON array" if option.kind == "array" else "JSON"
    if isinstance(value, (bytes, bytearray)):
        raise InvalidRequest(option.name, f"must be {what}, not a file")
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            raise InvalidRequest(option.name, f"must be {what}, got {value[:40]!r}") from None
        except RecursionError:  # "[[[[..." nested deeper than the parser recurses, as read_body refuses a body
            raise InvalidRequest(option.name, "is nested too deeply") from None
    return value
