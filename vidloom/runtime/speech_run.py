"""Speech requests over the one engine: the one check that a model speaks, and its card's admission.

A card that speaks names its admission function (`ModelCard.speech`): given the engine and a validated
request it picks the voice, builds the prompt, sizes the request and returns the run's input slots and its
estimated bytes. The engine starts the run of its program (thinker -> talker -> token2wav -> vocoder) from
them like any other request's (Engine.submit).
"""

from __future__ import annotations

from typing import Any

from vidloom.core import plugin
from vidloom.core.errors import InvalidRequest
from vidloom.core.speech import SpeechRequest


def no_speech(model_id: str) -> InvalidRequest:
    return InvalidRequest("model", f"{model_id} cannot speak (its card has no talker); use a speech checkpoint "
                                   "such as a Qwen2.5-Omni folder or qwen-omni-demo")


def speech_inputs(engine: Any, request: SpeechRequest) -> tuple[dict[str, Any], int]:
    """`request`'s run slots and estimated bytes on `engine` (an EngineAPI); InvalidRequest naming the field, or
    InvalidRequest("model") when the model cannot speak here (no talker on its card, no paged decoder)."""
    card = engine.instance.card
    if card.speech is None or engine.decoder is None:
        raise no_speech(card.model_id)
    request.validate()
    return plugin.resolve(card.speech)(engine, request)
