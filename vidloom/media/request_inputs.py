"""Resolving a request with its media opened: the MediaReader core's resolve_request takes, and the entry point
every caller above core uses (the CLI, the Python API, the server, the runtime).

Files are checked from their headers only (EncodedImage / EncodedVideo, see media.uploads): the thread that runs
the request decodes them, so a queued request holds no pixels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vidloom.core import request as core_request

if TYPE_CHECKING:
    from vidloom.core.card import ModelCard
    from vidloom.core.request import GenerationRequest


class UploadReader:
    """core.request_media.MediaReader over vidloom.media: PIL images, arrays, paths or upload bytes.

    The readers are imported when a request carries media: PyAV and PIL stay out of the import path of the
    runtime (the GPU check's image has no PyAV)."""

    def images(self, value: Any, field: str) -> tuple[Any, ...]:
        from vidloom.media.image import open_images

        return open_images(value, field)

    def image(self, value: Any, field: str) -> Any:
        from vidloom.media.image import open_image

        return open_image(value, field)

    def video(self, value: Any, field: str, min_frames: int) -> Any:
        from vidloom.media.uploads import open_video

        return open_video(value, field, min_frames)

    def audio(self, value: Any, field: str, sample_rate: int) -> Any:
        from vidloom.media.audio_files import open_audio

        return open_audio(value, field, sample_rate)


READER = UploadReader()


def resolve_request(request: GenerationRequest, card: ModelCard) -> GenerationRequest:
    """core.request.resolve_request with this package's reader: fill defaults, open media, validate."""
    return core_request.resolve_request(request, card, READER)
