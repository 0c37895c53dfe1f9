"""The extend_from block of causal video models (AnyFlow-FAR): an extension continues a finished video.

The extension's video is the source's followed by new frames, under a new prompt; it keeps the source's size,
frame rate and CFG choice (its first chunk attends to KV made under the source's conditioning).
"""

from __future__ import annotations

from typing import Any

from vidloom.core.card import ModelCard
from vidloom.core.errors import InvalidRequest
from vidloom.core.request import GenerationRequest
from vidloom.core.session import EXTEND_FROM, VideoSession, extension_fields

RESOLVER = "vidloom.families.wan_causal.extension:resolve_extension"
CHECK = "vidloom.families.wan_causal.extension:check_extension_guidance"


def resolve_extension(request: GenerationRequest, card: ModelCard) -> dict[str, Any]:
    """The extend_from block's resolver: the fields an extension takes from its source (size, fps, length), checked.

    The extension's video is the source's followed by new frames: num_frames counts both and
    defaults to the source's plus as many new frames as a default video has after its first.
    """
    fields = extension_fields(request, card, "causal")
    if not fields:
        return {}
    session = fields[EXTEND_FROM]
    assert isinstance(session, VideoSession)
    frames = request.num_frames
    if frames is None:
        frames = session.num_frames + card.sampling_defaults.num_frames - 1
    elif frames <= session.num_frames:
        raise InvalidRequest("num_frames", f"{frames} frames are all taken by the source video ({session.num_frames}); "
                                           "num_frames counts the source and the new frames together")
    fields["num_frames"] = frames
    return fields


def check_extension_guidance(request: GenerationRequest, card: ModelCard) -> None:
    """The extension's first chunk attends to KV made under the source's CFG branches: the count must match."""
    session = request.option("extend_from")
    if isinstance(session, VideoSession) and session.uses_cfg != request.uses_cfg:
        raise InvalidRequest("guidance_scale", f"{request.guidance_scale} and the source video's "
                                               f"{session.guidance_scale} differ in whether CFG runs (> 1); "
                                               "an extension keeps the source's choice")
