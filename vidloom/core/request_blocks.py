"""What a card accepts beyond the common request fields: its typed per-family blocks, and which common fields.

A block (an action, a camera, a video to extend) is given through one or more GenerationRequest fields and
read only by cards that declare it in `ModelCard.request_blocks`; the card's BlockSpec names the resolver that
checks the block at the boundary and replaces it with its typed form. Everything family-specific about a block
(its value rules, its limits, what it sets) lives in the family's recipe, behind that resolver.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Mapping

from vidloom.core import plugin
from vidloom.core.errors import InvalidRequest

if TYPE_CHECKING:
    from vidloom.core.card import ModelCard
    from vidloom.core.request import GenerationRequest


@dataclass(frozen=True)
class BlockFields:
    """How a block arrives on a request: the fields it is given through (the first holds the resolved block)."""

    fields: tuple[str, ...]
    refusal: str  # why a card that does not declare the block refuses it (after "<model> does not accept <field>: ")


REQUEST_BLOCKS: Mapping[str, BlockFields] = MappingProxyType({
    # Resolved first: an extension takes its size and length from its source before anything else reads them.
    "extend_from": BlockFields(("extend_from",), "it is not a causal video model; only those (AnyFlow-FAR) can "
                                                 "extend a video"),
    "action": BlockFields(("action",), "it has no action pathway"),
    "camera": BlockFields(("camera", "c2w", "intrinsics"), "it is not a camera-controlled world model"),
})
"""Typed per-family request blocks, in the order they are resolved."""


def given_fields(request: GenerationRequest, block: str) -> list[str]:
    """The fields of `block` that `request` sets."""
    return [name for name in REQUEST_BLOCKS[block].fields if getattr(request, name) is not None]


def resolve_blocks(request: GenerationRequest, card: ModelCard) -> GenerationRequest:
    """Each block the request gives, checked by its card's resolver (which may also set size and frames);
    InvalidRequest naming the field for a block the card does not declare, or a required one left out."""
    import dataclasses

    for name, block in REQUEST_BLOCKS.items():
        given = given_fields(request, name)
        spec = card.request_blocks.get(name)
        if given and spec is None:
            raise InvalidRequest(given[0], f"{card.model_id} does not accept {given[0]}: {block.refusal}")
        if spec is None:
            continue
        if not given and spec.required:
            field = spec.required[0]
            raise InvalidRequest(field, f"{card.model_id} needs {field} (its {name} block; it serves "
                                        f"{', '.join(sorted(t.value for t in card.tasks))})")
        if given:
            request = dataclasses.replace(request, **_target(spec.resolver)(request, card))
    return request


def check_blocks(resolved: GenerationRequest, card: ModelCard) -> None:
    """The block rules that read the filled request (e.g. an extension keeps its source's CFG choice)."""
    for name, spec in card.request_blocks.items():
        if spec.check is not None and given_fields(resolved, name):
            _target(spec.check)(resolved, card)


def _target(ref: str) -> Any:
    return plugin.resolve(ref)


OPTIONAL_FIELDS = ("negative_prompt", "height", "width", "num_frames", "fps", "num_inference_steps", "guidance_scale",
                   "flow_shift", "sampler", "step_cache_threshold", "extend_from")
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
