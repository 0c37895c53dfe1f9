"""A request's conditioning media (image, last_image, video, init_audio): checked against the card, opened
through a MediaReader the caller injects (vidloom.media.request_inputs), and the task inferred from them.

Core never opens a file itself: decoding belongs to `media`, which sits above core; resolve_request takes
the reader from the layer that calls it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from vidloom.core.errors import InvalidRequest, LimitExceeded
from vidloom.core.request_checks import MAX_GUIDANCE, check_float
from vidloom.core.task import Task

if TYPE_CHECKING:
    from vidloom.core.card import ModelCard
    from vidloom.core.request import GenerationRequest

MEDIA_INPUTS = ("image", "last_image", "video", "init_audio")
"""Media request fields a card must list in ModelCard.inputs to accept; a MediaReader opens them."""
V2V_DEFAULT_STRENGTH = 0.8  # diffusers' WanVideoToVideoPipeline default
MIN_VIDEO_FRAMES = 5  # V2V: the Wan VAE's smallest multi-frame input (1 + 4)


class MediaReader(Protocol):
    """Opens a request's media from what a caller gave (an array, PIL image, path or bytes), checking files
    from their headers only (the thread that runs the request decodes them); InvalidRequest naming `field`."""

    def images(self, value: Any, field: str) -> tuple[Any, ...]: ...  # each has .size (width, height)

    def image(self, value: Any, field: str) -> Any: ...

    def video(self, value: Any, field: str, min_frames: int) -> Any: ...  # a sequence of frames (len)

    def audio(self, value: Any, field: str, sample_rate: int) -> Any: ...  # float32 [channels, samples]


def resolve_media(r: GenerationRequest, card: ModelCard, media: MediaReader | None) -> dict[str, Any]:
    """Check the media fields against the card, open them, infer the task from them."""
    _refuse_inputs(r, card)
    given = [name for name in MEDIA_INPUTS if getattr(r, name) is not None]
    if given and media is None:  # a caller bug, not the user's: say which entry point opens media
        raise TypeError(f"{given[0]} needs a MediaReader: resolve through vidloom.media.request_inputs")
    out: dict[str, Any] = {}
    if r.last_image is not None and r.image is None:
        raise InvalidRequest("last_image", "needs image (the first frame) as well")
    if r.image is not None and r.video is not None:
        raise InvalidRequest("video", "give either image or video, not both")
    if r.option("strength") is not None and r.video is None:
        raise InvalidRequest("strength", "applies only to video-to-video (give video)")
    if r.init_audio is not None:
        out["init_audio"] = media.audio(r.init_audio, "init_audio", card.audio.sample_rate if card.audio else 0)
    if r.image is not None:
        out["image"] = media.images(r.image, "image")
    if r.last_image is not None:
        out["last_image"] = media.image(r.last_image, "last_image")
    if r.video is not None:
        out.update(_video(r, card, media))
    if r.task == Task.T2V and (r.video is not None or r.image is not None):
        out["task"] = Task.V2V if r.video is not None else Task.I2V
    task = out.get("task", r.task)
    for name, needs in (("image", Task.I2V), ("video", Task.V2V)):
        if (task == needs and task in card.tasks and getattr(r, name) is None and r.option("extend_from") is None
                and r.option("action") is None):  # an action block carries its own frames
            raise InvalidRequest(name, f"task {needs.value} needs a conditioning {name}")
    if "image" in out:
        _check_images(out["image"], card, task == Task.I2V)
    missing = [name for name in MEDIA_INPUTS if name in card.required_inputs and getattr(r, name) is None]
    if missing:
        raise InvalidRequest(missing[0], f"{card.model_id} needs {missing[0]} (it serves "
                                         f"{', '.join(sorted(t.value for t in card.tasks))})")
    if r.option("guidance_scale_2") is not None:
        check_float("guidance_scale_2", r.option("guidance_scale_2"), minimum=0.0, maximum=MAX_GUIDANCE,
                    open_min=False)
    return out


def _refuse_inputs(r: GenerationRequest, card: ModelCard) -> None:
    for name in MEDIA_INPUTS:
        if getattr(r, name) is not None and name not in card.inputs:
            accepted = ", ".join(sorted(card.inputs)) or "none"
            raise InvalidRequest(name, f"{card.model_id} does not accept {name} (its extra inputs: {accepted})")


def _video(r: GenerationRequest, card: ModelCard, media: MediaReader) -> dict[str, Any]:
    """V2V (the card takes strength): the output is as long as the video; else a context clip the output
    continues (AnyFlow-FAR), whole latent frames of it."""
    v2v = "strength" in card.option_names
    video = media.video(r.video, "video", MIN_VIDEO_FRAMES if v2v else 1)
    out: dict[str, Any] = {"video": video}
    if v2v:
        if r.num_frames is not None and r.num_frames != len(video):
            raise InvalidRequest("num_frames", f"is {r.num_frames} but the video has {len(video)} frames")
        out["num_frames"] = len(video)
        strength = r.option("strength", V2V_DEFAULT_STRENGTH)
        check_float("strength", strength, minimum=0.0, maximum=1.0, open_min=True)
        out["options"] = {"strength": strength}
    elif (len(video) - 1) % (step := card.geometry.temporal_factor):
        raise InvalidRequest("video", f"has {len(video)} frames; the VAE needs {step}k+1 (e.g. 1, {step + 1})")
    return out


def _check_images(images: tuple[Any, ...], card: ModelCard, first_frame: bool) -> None:
    """I2V takes one first frame; other tasks take up to the card's reference images, each large enough."""
    limit, name = (1, "one first frame") if first_frame else (card.max_reference_images, "max_reference_images")
    if len(images) > limit:
        raise LimitExceeded("image", f"{len(images)} images is more than the limit of {limit}", name)
    for i, image in enumerate(images):
        if min(image.size) < card.min_image_side:
            raise InvalidRequest("image", f"image {i} is {image.size[0]}x{image.size[1]}; both sides must be at "
                                          f"least {card.min_image_side} px")


def size_from_image(image: Any, request: GenerationRequest, card: ModelCard) -> dict[str, int]:
    """height/width the caller left out: the input image's (or first video frame's), floored to the size multiple."""
    multiple = card.geometry.spatial_multiple
    return {name: max(multiple, value // multiple * multiple)
            for name, value in (("width", image.size[0]), ("height", image.size[1])) if getattr(request, name) is None}
