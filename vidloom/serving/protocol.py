"""Pydantic request and response models: the OpenAI Videos / Images / Models shapes plus our extensions."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict

from vidloom.serving.job_store import JobRecord


def _no_bool(value: object) -> object:
    # Pydantic's lax mode turns true into 1; a boolean step count is a client bug, not a number.
    if isinstance(value, bool):
        raise ValueError("must be a number, not a boolean")
    return value


def _strict_bool(value: object) -> object:
    # Pydantic's lax mode reads "yes", "on", "1" and 1 as true; a client sending those is guessing. JSON says
    # true / false, and a form field (text only) spells them "true" / "false": both paths get one answer.
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value in _FORM_BOOLS:
        return _FORM_BOOLS[value]
    raise ValueError("must be true or false")


def _json_text(value: object) -> object:
    # A multipart form carries a nested block as one text field holding its JSON.
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            raise ValueError("must be a JSON object (in a form: the block's JSON as text)") from None
    return value


_FORM_BOOLS = {"true": True, "false": False}
ApiInt = Annotated[int, BeforeValidator(_no_bool)]
ApiFloat = Annotated[float, BeforeValidator(_no_bool)]
ApiBool = Annotated[bool, BeforeValidator(_strict_bool)]


def body_doc(model: type[BaseModel], *media_types: str) -> dict[str, Any]:
    """`openapi_extra` for a route that reads its body itself (read_body): the body's schema under each media
    type, so /openapi.json describes what clients send (and a schema-driven fuzzer can generate it)."""
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})
    content = {media: {"schema": _inline(schema, defs)} for media in media_types or ("application/json",)}
    return {"requestBody": {"required": True, "content": content}}


def _inline(node: Any, defs: dict[str, Any]) -> Any:
    # OpenAPI documents have no top-level $defs for "#/$defs/X" to point at; our bodies nest without cycles.
    if isinstance(node, dict):
        ref = node.get("$ref", "")
        if ref.startswith("#/$defs/"):
            return _inline(defs[ref.removeprefix("#/$defs/")], defs)
        return {key: _inline(value, defs) for key, value in node.items()}
    if isinstance(node, list):
        return [_inline(item, defs) for item in node]
    return node


class LoraRef(BaseModel):
    """One adapter a request runs with: a name loaded on the server (GET /v1/loras) and its scale."""

    model_config = ConfigDict(extra="forbid")

    name: str
    scale: ApiFloat = 1.0


class LoraLoadBody(BaseModel):
    """POST /v1/loras: load the adapter file at `path` (on the server's disk) as `name`."""

    model_config = ConfigDict(extra="forbid")

    name: str
    path: str
    into: str | None = None  # a component instead of the default, e.g. a Wan2.2 A14B's "transformer_2" expert


class ActionBlock(BaseModel):
    """vidloom extension (world models with an action pathway): the `action` block of POST /v1/videos.

    The conditioning frame is `input_reference` (or `video`, which inverse_dynamics needs); the video's size
    and length follow from them and `chunk_size`. In a multipart form, send the block as one JSON text field.
    """

    model_config = ConfigDict(extra="forbid")

    mode: str
    domain_name: str
    raw_actions: list[list[ApiFloat]] | None = None  # forward_dynamics: [T, D]
    chunk_size: ApiInt = 16
    view_point: str = "ego_view"
    resolution_tier: ApiInt = 480


class SamplingExtensions(BaseModel):
    """vidloom extensions shared by videos and images; None takes the model card's default."""

    model_config = ConfigDict(extra="forbid")

    negative_prompt: str | None = None
    num_inference_steps: ApiInt | None = None
    guidance_scale: ApiFloat | None = None
    flow_shift: ApiFloat | None = None
    sampler: str | None = None
    seed: ApiInt | None = None
    step_cache_threshold: ApiFloat | None = None  # overrides the deployment's step-cache threshold
    loras: list[LoraRef] | None = None  # LoRA adapters loaded on the server, mixed in this order


class VideoCreateBody(SamplingExtensions):
    """POST /v1/videos (JSON or multipart form; form values arrive as strings and are coerced), plus the served
    model's options."""

    prompt: str
    model: str | None = None
    seconds: str | ApiFloat | None = None  # the OpenAI client sends a string such as "4"
    size: str | None = None  # "WxH"
    input_reference: Any = None  # multipart file: the first frame (image-to-video), as OpenAI's Videos API
    num_frames: ApiInt | None = None
    fps: ApiInt | None = None
    # vidloom extensions (multipart files), accepted where the model card lists them.
    last_image: Any = None
    video: Any = None
    # The served model's option blocks add their fields to this body (serving.option_fields): a camera, an
    # action block, extend_from... In a form, array and JSON options are JSON text.


class ImageGenerationBody(SamplingExtensions):
    """POST /v1/images/generations (and, as a form, the text fields of /v1/images/edits)."""

    prompt: str
    model: str | None = None
    n: ApiInt = 1
    size: str | None = None
    response_format: str | None = None  # b64_json (default) | url
    output_format: str | None = None  # png (default) | jpeg | webp
    user: str | None = None  # accepted and ignored, as OpenAI uses it only for abuse tracking


class ImageEditBody(ImageGenerationBody):
    """The text fields of POST /v1/images/edits; the images arrive as file parts."""

    mask: Any = None  # accepted by name only so we can say it is unsupported


class VideoError(BaseModel):
    code: str
    message: str


class VideoObject(BaseModel):
    """The OpenAI `Video` object; `cancelled`, `parameters`, `metadata` and `time_to_first_chunk_s` are vidloom
    extensions."""

    id: str
    object: Literal["video"] = "video"
    model: str
    status: Literal["queued", "in_progress", "completed", "failed", "cancelled"]
    progress: int
    created_at: int
    completed_at: int | None = None
    expires_at: int | None = None
    size: str
    seconds: str
    prompt: str | None = None
    remixed_from_video_id: str | None = None
    error: VideoError | None = None
    parameters: dict[str, Any]  # the resolved request but its prompt (see `prompt`): defaults filled, seed used
    metadata: dict[str, Any] | None = None  # run metadata once completed (e.g. elapsed_s)
    time_to_first_chunk_s: float | None = None  # creation to first decoded chunk (models that stream chunks)

    @classmethod
    def from_record(cls, record: JobRecord) -> "VideoObject":
        error = None
        if record.error_code is not None:
            error = VideoError(code=record.error_code, message=record.error_message or "")
        return cls(
            id=record.id, model=record.model, status=record.status, progress=record.progress,  # type: ignore[arg-type]
            created_at=record.created_at, completed_at=record.completed_at, size=record.size,
            seconds=record.seconds, prompt=record.prompt, error=error,
            parameters=dict(record.params), metadata=dict(record.metadata) if record.metadata else None,
            time_to_first_chunk_s=record.time_to_first_chunk_s,
        )


class VideoList(BaseModel):
    object: Literal["list"] = "list"
    data: list[VideoObject]
    first_id: str | None
    last_id: str | None
    has_more: bool


class VideoDeleted(BaseModel):
    id: str
    object: Literal["video.deleted"] = "video.deleted"
    deleted: bool = True


class ProgressData(BaseModel):
    """Payload of an SSE `progress` event: `step`/`total` count the current phase, `percent` the whole job."""

    id: str
    status: str
    phase: str | None
    step: int
    total: int
    percent: int


class ChunkData(BaseModel):
    """Payload of an SSE `chunk` event: frames [start_frame, stop_frame) of the video exist (decoded and in
    the `variant=stream` file); `stop_s` is the seconds of video ready so far."""

    id: str
    index: int  # 0-based; chunks arrive in order
    total: int  # chunks the video will have
    start_frame: int
    stop_frame: int
    start_s: float
    stop_s: float
    fps: int
    missed_chunks: int = 0  # earlier chunk events this stream dropped because its reader fell behind


class ImageData(BaseModel):
    b64_json: str | None = None
    url: str | None = None
    revised_prompt: str | None = None


class ImagesResponse(BaseModel):
    created: int
    data: list[ImageData]
    output_format: str | None = None
    size: str | None = None


class ModelObject(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "vidloom"


class AdapterObject(ModelObject):
    """A resident LoRA adapter, listed beside its base model as vLLM lists its adapters."""

    parent: str  # the base model's id
    root: str  # the name of the adapter file it was loaded from


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[AdapterObject | ModelObject]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail
