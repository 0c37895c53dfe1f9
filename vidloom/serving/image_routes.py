"""Routes under /v1/images: generations (JSON), edits (multipart with reference images), and files for url answers."""

from __future__ import annotations

import asyncio
import base64
import json
import time
import uuid
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from starlette.datastructures import UploadFile

from vidloom.core.output import VideoOutput
from vidloom.media.image import MEDIA_TYPES, encode_image, open_images
from vidloom.serving.api_keys import Caller, caller_of
from vidloom.serving.disconnect import unless_disconnected
from vidloom.serving.errors import APIError, engine_errors, store_error
from vidloom.serving.file_response import OpenFileResponse
from vidloom.serving.form_body import read_form
from vidloom.serving.job_store import JobStore, is_image_file
from vidloom.serving.params import PlannedImages, image_api_field, plan_images
from vidloom.serving.protocol import ImageData, ImageEditBody, ImageGenerationBody, ImagesResponse, body_doc
from vidloom.serving.request_body import read_body, validate_fields
from vidloom.serving.video_routes import jobs_of

router = APIRouter(prefix="/v1/images")
IMAGE_FILE_FIELDS = ("image", "image[]")  # the openai client sends a list of images as image[]


@router.post("/generations", openapi_extra=body_doc(ImageGenerationBody))
async def generate_images(request: Request) -> ImagesResponse:
    """Text-to-image (`n` images); answers when all are ready. On a video model an image is a one-frame video."""
    manager = jobs_of(request)
    body = await read_body(request, ImageGenerationBody)
    with engine_errors(image_api_field):
        planned = plan_images(body, manager.card)
    return await _render(request, planned)


@router.post("/edits", openapi_extra=body_doc(ImageEditBody, "multipart/form-data"))
async def edit_images(request: Request) -> ImagesResponse:
    """Reference-image editing: multipart `image` (one or more files, also as `image[]`), `prompt`, `n`, `size`..."""
    manager = jobs_of(request)
    fields, files = await _edit_form(request, manager.card.max_reference_images)
    body = validate_fields(fields, ImageEditBody)
    if body.mask is not None:
        raise APIError(400, "mask: masked editing is not supported; send only reference images",
                       param="mask", code="invalid_parameter")
    if not files:
        raise APIError(400, "image: send one or more image files", param="image", code="invalid_parameter")
    with engine_errors(image_api_field):
        # Checked from their headers on the media pool; the queued requests hold the files, decoded when they run.
        images = await manager.media.run(open_images, list(files), "image")
        planned = plan_images(body, manager.card, images)
    return await _render(request, planned)


@router.get("/files/{name}")
async def image_file(request: Request, name: str) -> OpenFileResponse:
    """A file written for a response_format=url answer; only its key's owner (and admins) may fetch it: another
    owner's file answers exactly like a missing one."""
    if is_image_file(name):
        for path in _image_files(jobs_of(request).store, name, caller_of(request.scope)):
            try:
                file = open(path, "rb")
            except FileNotFoundError:
                continue
            return OpenFileResponse(file, path, media_type=MEDIA_TYPES[path.suffix[1:]], filename=name)
    raise APIError(404, "no such image file", param="name", code="image_not_found")


def _image_files(store: JobStore, name: str, caller: Caller) -> list[Path]:
    """Where `caller` may find the file `name`: its owner's folder; an admin's, also every other owner's."""
    own = [store.image_path(name, caller.owner)] if caller.owner is not None else []
    return own + store.image_paths(name) if caller.admin else own


async def _render(request: Request, planned: PlannedImages) -> ImagesResponse:
    manager = jobs_of(request)
    with engine_errors(image_api_field):
        outputs = await unless_disconnected(request, manager.generate_images(planned.requests))
    data = [await _answer(request, output, planned) for output in outputs]
    first = outputs[0].frames[0]
    return ImagesResponse(created=int(time.time()), data=data, output_format=planned.output_format,
                          size=f"{first.shape[1]}x{first.shape[0]}")


async def _answer(request: Request, output: VideoOutput, planned: PlannedImages) -> ImageData:
    encoded = await asyncio.to_thread(encode_image, output.frames[0], planned.output_format)
    if planned.response_format == "b64_json":
        return ImageData(b64_json=base64.b64encode(encoded).decode())
    name = f"img_{uuid.uuid4().hex}.{planned.output_format}"
    try:
        await asyncio.to_thread(jobs_of(request).store.save_image, name, encoded, caller_of(request.scope).owner)
    except OSError as exc:
        raise store_error(exc, "the image cannot be stored") from None
    return ImageData(url=f"{str(request.base_url).rstrip('/')}/v1/images/files/{name}")


# Form fields whose value is JSON text (a list of objects has no flat form encoding): `loras`, as in the JSON body.
JSON_FORM_FIELDS = frozenset({"loras"})


def _json_field(key: str, value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError:
        raise APIError(400, f"{key}: a form field holding JSON text, e.g. "
                       '[{"name": "watercolor", "scale": 0.8}]', param=key, code="invalid_parameter") from None


async def _edit_form(request: Request, max_images: int) -> tuple[dict[str, Any], list[bytes]]:
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != "multipart/form-data":
        raise APIError(400, "images/edits takes multipart/form-data with image file parts",
                       code="unsupported_content_type")
    # One more file than the model takes (and a mask), so "too many images" is reported by name.
    form = await read_form(request, max_files=max(1, max_images) + 2)
    fields: dict[str, Any] = {}
    files: list[bytes] = []
    for key, value in form.multi_items():
        if isinstance(value, UploadFile):
            if key == "mask":
                fields["mask"] = "<file>"
            elif key not in IMAGE_FILE_FIELDS:
                raise APIError(400, f"{key}: must be a text field, not a file", param=key, code="invalid_parameter")
            else:
                files.append(await value.read())
        elif key in IMAGE_FILE_FIELDS:
            raise APIError(400, "image: must be a file part", param="image", code="invalid_parameter")
        elif key in JSON_FORM_FIELDS:
            fields[key] = _json_field(key, value)
        else:
            fields[key] = value
    if max_images and len(files) > max_images:
        raise APIError(400, f"image: {len(files)} images is more than the limit of {max_images}",
                       param="image", code="limit_exceeded")
    return fields, files
