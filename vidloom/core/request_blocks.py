"""What a card accepts beyond the general request fields: its option blocks (core.options), and which common fields.

A request carries the options it gives under `GenerationRequest.options`; each must belong to a block the card
declares in `ModelCard.request_blocks`, whose BlockSpec names the resolver that checks the block at the boundary
and replaces it with its typed form. Everything family-specific about a block (its value rules, its limits,
what it sets) lives in the family's folder, behind that resolver.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import TYPE_CHECKING, Any

from vidloom.core import plugin
from vidloom.core.errors import InvalidRequest

if TYPE_CHECKING:
    from vidloom.core.card import ModelCard
    from vidloom.core.request import GenerationRequest


def given_options(request: GenerationRequest, block: str, card: ModelCard) -> list[str]:
    """The options of the card's block `block` that `request` gives."""
    return [name for name in card.request_blocks[block].block.names if name in request.options]


def resolve_blocks(request: GenerationRequest, card: ModelCard) -> GenerationRequest:
    """Each block the request gives, checked by its card's resolver (which may also set size and frames), in the
    card's order; InvalidRequest naming the option for one no block of the card declares, one of the wrong
    kind, or a required one left out."""
    refuse_undeclared(request, card)
    for name, spec in card.request_blocks.items():
        given = given_options(request, name, card)
        if not given and spec.required:
            field = spec.required[0]
            raise InvalidRequest(field, f"{card.model_id} needs {field} (its {name} block; it serves "
                                        f"{', '.join(sorted(t.value for t in card.tasks))})")
        if given and spec.resolver is not None:
            request = dataclasses.replace(request, **_target(spec.resolver)(request, card))
    return request


def refuse_undeclared(request: GenerationRequest, card: ModelCard) -> None:
    """InvalidRequest naming the first option the card's blocks do not declare, or one of the wrong kind."""
    options = {option.name: option for spec in card.request_blocks.values() for option in spec.block.options}
    for name, value in request.options.items():
        option = options.get(name)
        if option is None:
            taken = ", ".join(options) or "none"
            close = difflib.get_close_matches(name, [*options, *(f.name for f in dataclasses.fields(request))], n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            raise InvalidRequest(name, f"{card.model_id} does not take {name} (its options: {taken}){hint}")
        if not _resolved(value):
            option.check_type(value)


def _resolved(value: Any) -> bool:
    """A resolver's typed form (a dataclass: CameraInput, ActionInput, VideoSession) is not re-checked by kind."""
    return dataclasses.is_dataclass(value)


def check_blocks(resolved: GenerationRequest, card: ModelCard) -> None:
    """The block rules that read the filled request (e.g. an extension keeps its source's CFG choice)."""
    for name, spec in card.request_blocks.items():
        if spec.check is not None and given_options(resolved, name, card):
            _target(spec.check)(resolved, card)


def _target(ref: str) -> Any:
    return plugin.resolve(ref)


OPTIONAL_FIELDS = ("negative_prompt", "height", "width", "num_frames", "fps", "num_inference_steps", "guidance_scale",
                   "flow_shift", "sampler", "step_cache_threshold")
"""Common request fields a card with `optional_fields` must list to accept (None means: the card's default)."""


def refuse_unread(r: GenerationRequest, card: ModelCard) -> None:
    """InvalidRequest naming the first common field the caller set that the card's program would not read."""
    if card.optional_fields is None:
        return
    for name in OPTIONAL_FIELDS:
        value = getattr(r, name)
        # The card's own default changes nothing (the server fills the size and frame count of every call).
        if value is not None and value != getattr(card.sampling_defaults, name, None) \
                and name not in card.optional_fields:
            taken = ", ".join(f for f in OPTIONAL_FIELDS if f in card.optional_fields) or "none"
            raise InvalidRequest(name, f"{card.model_id} does not take {name} (fields it takes: {taken})")
