"""Clip lengths of adapted audio pipelines: the card's AudioSpec read from the folder's configs, and a request's
`seconds` (and `seconds_start`) passed as the pipeline's own length arguments.

The pipeline decides its default length from its configs when its length argument is left at None; the card
states that same default (computed in the same order, so passing it changes no bit of the output) so the
request, the job record and `GET /v1/models` all say how long the clip will be.
"""

from __future__ import annotations

import math
from typing import Any

from vidloom.core.card import AudioSpec
from vidloom.core.errors import CheckpointError
from vidloom.core.request import GenerationRequest
from vidloom.families.diffusers_adapter.signature import PipelineShape

# A pipeline that takes any length (AudioLDM's convolutional UNet over mel frames) is trained on its default
# window; requests may ask up to this many windows (AudioLDM: 4 x 10.24 s). Memory and time grow linearly.
MAX_WINDOWS = 4
END_ARG = "audio_end_in_s"  # Stable Audio: the clip ends there, after audio_start_in_s; its window is the limit


def audio_spec(shape: PipelineShape, denoiser: dict[str, Any], vae: dict[str, Any],
               vocoder: dict[str, Any]) -> AudioSpec | None:
    """The seconds rules of an audio pipeline that takes a length; None for one whose clips have a fixed length."""
    if shape.output != "audio" or "seconds" not in shape.args:
        return None
    rate = _positive(vocoder.get("sampling_rate")) or _positive(vae.get("sampling_rate"))
    if rate is None:
        raise CheckpointError(f"{shape.class_name}: neither its vocoder nor its VAE config states a sampling_rate")
    window, shortest = _window(denoiser, vae, vocoder, rate)
    default = shape.defaults.get("seconds")
    if isinstance(default, (int, float)) and not isinstance(default, bool) and default > 0:
        window = float(default) if window is None else window
    else:
        default = window
    if window is None:  # a layout we cannot read the length from: the pipeline's own default length only
        return None
    bounded = shape.args["seconds"] == END_ARG
    longest = window if bounded else MAX_WINDOWS * max(window, float(default))
    return AudioSpec(max_seconds=longest, default_seconds=min(float(default), longest), min_start=0.0,
                     max_end=longest, sample_rate=rate, min_seconds=shortest,
                     takes_start="seconds_start" in shape.args)


def length_kwargs(shape: PipelineShape, request: GenerationRequest) -> dict[str, Any]:
    """The pipeline's length keyword arguments for a resolved request (none when its card has no AudioSpec)."""
    if shape.output != "audio" or "seconds" not in shape.args or request.option("seconds") is None:
        return {}
    arg = shape.args["seconds"]
    start = float(request.option("seconds_start") or 0.0)
    if arg != END_ARG:
        return {arg: request.option("seconds")}
    kwargs: dict[str, Any] = {arg: start + request.option("seconds")}
    if "seconds_start" in shape.args:
        kwargs[shape.args["seconds_start"]] = start
    return kwargs


def _window(denoiser: dict[str, Any], vae: dict[str, Any], vocoder: dict[str, Any],
            rate: int) -> tuple[float | None, float]:
    """(the default clip length, the shortest clip) as the pipelines derive them from their configs."""
    size = denoiser.get("sample_size")
    upsample = vocoder.get("upsample_rates")
    if isinstance(upsample, list) and upsample:  # mel spectrogram -> vocoder (AudioLDM, AudioLDM2, MusicLDM)
        frame = math.prod(upsample) / rate  # seconds per mel frame
        scale = 2 ** (len(vae.get("block_out_channels", ())) - 1)
        return (size * scale * frame if isinstance(size, int) else None), frame
    ratios = vae.get("downsampling_ratios")
    if isinstance(ratios, list) and ratios and isinstance(size, int):  # waveform VAE (Oobleck: Stable Audio)
        return size * math.prod(ratios) / rate, 1.0 / rate
    return None, 1.0 / rate


def _positive(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
