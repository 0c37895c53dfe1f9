"""GET /v1/models/{id}'s extension: what the served card can do, so a client (the web playground) can build its form.

Read-only, derived from the ModelCard and the server's request limits; behind the API key like every /v1 route.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from vidloom.core.blocks import EXTEND_FROM
from vidloom.core.card import ModelCard
from vidloom.core.limits import RequestLimits
from vidloom.core.program import Program
from vidloom.core.request import MEDIA_INPUTS, Task
from vidloom.media.speech_audio import SPEECH_FORMATS
from vidloom.serving.audio_routes import OUTPUT_FORMATS
from vidloom.serving.protocol import ModelObject

VIDEO_TASKS = (Task.T2V, Task.I2V, Task.V2V)
# The API field each card input arrives in (params._media maps them back).
API_FIELDS = {"image": "input_reference", "last_image": "last_image", "video": "video"}


class OptionField(BaseModel):
    """One option of the card's blocks (core.options) as a client sees it, to build a form field for it."""

    name: str  # the HTTP field
    block: str  # the block it belongs to (camera, audio_length, reasoning...)
    kind: str  # float | int | bool | str | array | json
    help: str
    required: bool  # every request must give it


class ModelCapabilities(BaseModel):
    """The card as a client sees it: request kinds, optional inputs, defaults and this server's limits."""

    tasks: list[str]  # t2v | i2v | v2v | t2i
    videos: bool  # POST /v1/videos works
    images: bool  # POST /v1/images/generations works
    audio: bool  # POST /v1/audio/generations works (audio-only models: no frames)
    chat: bool  # POST /v1/chat/completions works (the card has an ar_decode loop)
    streams_chunks: bool  # a causal model: variant=stream grows while the job runs
    sessions: bool  # a world model: POST /v1/sessions opens an interactive session (its WebSocket drives it)
    produces_audio: bool  # the mp4 carries a soundtrack
    speech: bool  # POST /v1/audio/speech works, and chat answers aloud (modalities ["text", "audio"])
    voices: list[str]  # the voices it speaks in, the first the default
    speech_formats: list[str]  # response_format values of /v1/audio/speech
    chat_inputs: list[str]  # the chat message part kinds it reads: text, image (image_url), audio (input_audio)
    inputs: list[str]  # optional request fields the card reads, under their API names (input_reference, sound...)
    options: list[OptionField]  # the card's options (also in `inputs`), with their kinds and help
    required_inputs: list[str]  # of those, the ones every request must give
    samplers: list[str]
    defaults: dict[str, Any]  # size, num_frames, fps, num_inference_steps, guidance_scale, flow_shift, ...
    size_multiple: int  # width and height must be multiples of this
    frame_multiple: int  # num_frames must be frame_multiple * k + 1
    limits: dict[str, int | None]  # max_pixels, max_frames, max_steps, max_prompt_chars (None: unchecked)
    context_window: int | None  # chat: prompt + completion tokens
    description: str
    notes: list[str]


class ModelDetails(ModelObject):
    """ModelObject plus the `capabilities` extension (clients reading only the OpenAI fields ignore it)."""

    capabilities: ModelCapabilities
    # Config keys the served load accepted without effect (file, key, value, why); docs/reference/config-keys.md.
    accepted_config_keys: list[str] = []


def capabilities(card: ModelCard, limits: RequestLimits | None, program: Program | None = None) -> ModelCapabilities:
    """`program`: the loaded one (its chat inputs and voices come from the checkpoint); None: text chat, no voices."""
    d = card.sampling_defaults
    generates = bool(card.tasks)
    defaults: dict[str, Any] = {}
    if generates:
        defaults = {"size": f"{d.width}x{d.height}", "num_frames": d.num_frames, "fps": d.fps,
                    "num_inference_steps": d.num_inference_steps, "guidance_scale": d.guidance_scale,
                    "flow_shift": d.flow_shift, "sampler": d.sampler, "negative_prompt": d.negative_prompt}
    if card.audio is not None:  # no frames or size: the clip's seconds instead
        defaults = {"seconds": card.audio.default_seconds, "seconds_start": card.audio.min_start,
                    "max_seconds": card.audio.max_seconds, "min_seconds": card.audio.min_seconds,
                    "takes_start": card.audio.takes_start, "sample_rate": card.audio.sample_rate,
                    "output_formats": list(OUTPUT_FORMATS),
                    "num_inference_steps": d.num_inference_steps, "guidance_scale": d.guidance_scale,
                    "sampler": d.sampler, "negative_prompt": d.negative_prompt}
    known = MEDIA_INPUTS  # init_audio: a file part of POST /v1/audio/generations
    options = [OptionField(name=option.name, block=name, kind=option.kind, help=option.help,
                           required=option.name in spec.required)
               for name, spec in card.request_blocks.items() for option in spec.block.options if option.http]
    block_fields = [option.name for option in options]  # camera, action...
    block_required = [option.name for option in options if option.required]
    return ModelCapabilities(
        tasks=sorted(t.value for t in card.tasks),
        videos=any(t in card.tasks for t in VIDEO_TASKS),
        images=Task.T2I in card.tasks,
        audio=Task.T2A in card.tasks,
        chat="ar_decode" in card.loops,
        # The chunked video families (AnyFlow-FAR's rollout, Helios' chunks): each chunk is decoded and streamed
        # as it finishes, and a finished video can be extended.
        streams_chunks="rollout" in card.loops or EXTEND_FROM in card.request_blocks,
        sessions=any(spec.session is not None for spec in card.request_blocks.values()),
        produces_audio=card.produces_audio,
        speech=card.speech is not None,
        voices=list(program.voices) if program is not None and card.speech is not None else [],
        speech_formats=list(SPEECH_FORMATS) if card.speech is not None else [],
        chat_inputs=sorted(program.chat_inputs if program is not None and program.chat_loop is not None
                           else {"text"}) if "ar_decode" in card.loops else [],
        inputs=[API_FIELDS.get(n, n) for n in known if n in card.inputs] + block_fields,
        options=options,
        required_inputs=[API_FIELDS.get(n, n) for n in known if n in card.required_inputs] + block_required,
        samplers=list(card.samplers),
        defaults=defaults,
        size_multiple=card.geometry.spatial_multiple,
        frame_multiple=card.geometry.temporal_factor,
        limits={name: getattr(limits, name, None) for name in
                ("max_pixels", "max_frames", "max_steps", "max_prompt_chars")},
        context_window=card.context_window,
        description=card.description,
        notes=list(card.notes),
    )
