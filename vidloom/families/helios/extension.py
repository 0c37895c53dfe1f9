"""Helios' extend_from block: an extension continues a finished Helios video under a new prompt.

It is the pipeline's video-to-video run on the source's own latents (HeliosPipeline with `image_latents` its first
latent frame and `video_latents` its chunks, nothing re-encoded): the source's first frame is the prefix and its
newest chunks the history. As that run does, it returns the new frames only (num_frames counts them, default the
card's), at the source's size and frame rate.
"""

from __future__ import annotations

from typing import Any

from vidloom.core.card import ModelCard
from vidloom.core.request import GenerationRequest
from vidloom.core.session import extension_fields

RESOLVER = "vidloom.families.helios.extension:resolve_extension"


def resolve_extension(request: GenerationRequest, card: ModelCard) -> dict[str, Any]:
    """The extend_from block's resolver: the source's session, size and frame rate, checked."""
    return extension_fields(request, card, "Helios")
