"""Speech requests over the one engine: the card's speech program started as a run, and its result.

A card that speaks names its admission function (`ModelCard.speech`); it validates the request,
picks the voice and returns a RequestRun of the family's program (thinker -> talker -> token2wav ->
vocoder). `speak_alone` steps it in the caller's thread (the sync API); the AsyncEngine submits the
same run beside every other request (`submit_run`).
"""

from __future__ import annotations

from typing import Any

from vidloom.core import plugin
from vidloom.core.errors import InvalidRequest
from vidloom.core.output import EventCallback
from vidloom.core.speech import SpeechRequest, SpeechResult
from vidloom.runtime.request_run import CancellationToken, RequestRun


def no_speech(model_id: str) -> InvalidRequest:
    return InvalidRequest("model", f"{model_id} cannot speak (its card has no talker); use a speech checkpoint "
                                   "such as a Qwen2.5-Omni folder or qwen-omni-demo")


def start_speech(engine: Any, request: SpeechRequest, on_event: EventCallback | None = None,
                 cancel: CancellationToken | None = None) -> RequestRun:
    """Validate `request` (InvalidRequest naming the field) and prepare its run on `engine`."""
    card = engine.instance.card
    if card.speech is None or getattr(engine, "decoder", None) is None:
        raise no_speech(card.model_id)
    return plugin.resolve(card.speech)(engine, request, on_event, cancel)


def speech_result(outputs: dict[str, Any]) -> SpeechResult:
    """A finished speech run's result (its program's `thinker`, `codes`, `audio`, `sample_rate` slots)."""
    request: SpeechRequest = outputs["request"]
    thinker = outputs["thinker"]
    return SpeechResult(request_id=request.request_id, audio=outputs["audio"], sample_rate=int(outputs["sample_rate"]),
                        text=thinker.text, voice=outputs["voice"], audio_tokens=int(outputs["codes"].numel()),
                        text_tokens=len(thinker.reply_ids), elapsed_s=float(outputs.get("elapsed_s", 0.0)))


def speak_alone(engine: Any, request: SpeechRequest, on_event: EventCallback | None = None,
                cancel: CancellationToken | None = None) -> SpeechResult:
    """Run `request` to the end in this thread; its KV (thinker and talker pool blocks) is returned however it ends."""
    return speech_result(start_speech(engine, request, on_event, cancel).finish())
