"""The served model's options as HTTP fields: derived from its card's blocks, typed by kind, in its schema, and
another model's option refused by name with the reason."""

from __future__ import annotations

import json

import pytest
from fastapi import FastAPI

from vidloom import registry
from vidloom.serving.audio_routes import AudioGenerationBody
from vidloom.serving.errors import APIError
from vidloom.serving.option_bodies import refuse_foreign, serve_options
from vidloom.serving.option_fields import body_model, option_values
from vidloom.serving.protocol import VideoCreateBody
from vidloom.serving.video_routes import router as video_router


def test_each_model_body_has_exactly_its_own_options():
    sana = body_model(VideoCreateBody, registry.resolve_card("sana-wm-demo"))
    wan = body_model(VideoCreateBody, registry.resolve_card("wan2.1-demo"))
    assert {"camera", "c2w", "intrinsics"} <= set(sana.model_fields)
    assert "camera" not in wan.model_fields and "strength" in wan.model_fields
    assert not {"camera", "strength", "reason", "action"} & set(VideoCreateBody.model_fields)  # none in the base
    audio = body_model(AudioGenerationBody, registry.resolve_card("stable-audio-demo"))
    assert {"seconds", "seconds_start"} <= set(audio.model_fields)
    assert audio.model_fields["seconds"].description.startswith("the clip's length")


def test_values_are_typed_by_kind_and_form_text_is_parsed():
    card = registry.resolve_card("sana-wm-demo")
    body = body_model(VideoCreateBody, card).model_validate(
        {"prompt": "a road", "camera": "w-8", "intrinsics": json.dumps([60, 60, 40, 24])})  # a form's JSON text
    assert option_values(body, card) == {"camera": "w-8", "intrinsics": [60, 60, 40, 24]}
    cosmos = registry.resolve_card("cosmos3-demo")
    model = body_model(VideoCreateBody, cosmos)
    assert option_values(model.model_validate({"prompt": "p", "reason": "true"}), cosmos) == {"reason": True}
    with pytest.raises(ValueError, match="true or false"):
        model.model_validate({"prompt": "p", "reason": "yes"})


def test_another_models_option_is_refused_with_its_reason():
    card = registry.resolve_card("wan2.1-demo")
    with pytest.raises(APIError) as refused:
        refuse_foreign({"prompt": "p", "camera": "w-8"}, VideoCreateBody, card)
    assert refused.value.param == "camera" and "not a camera-controlled world model" in refused.value.message
    refuse_foreign({"prompt": "p", "strength": 0.5, "seconds": "4"}, VideoCreateBody, card)  # its own; base's seconds
    data = {"prompt": "p", "reason": False, "camera": None, "colour": None}
    refuse_foreign(data, VideoCreateBody, card)  # another model's option left off is "not given"...
    assert data == {"prompt": "p", "colour": None}  # ...an unknown key stays, for the body model to refuse
    with pytest.raises(ValueError, match="colour"):
        body_model(VideoCreateBody, card).model_validate(data)


def test_the_schema_shows_the_served_models_options():
    app = FastAPI()
    app.include_router(video_router)
    serve_options(app, registry.resolve_card("sana-wm-demo"), {"/v1/videos": VideoCreateBody})
    content = app.openapi()["paths"]["/v1/videos"]["post"]["requestBody"]["content"]
    assert set(content) == {"application/json", "multipart/form-data"}
    properties = content["application/json"]["schema"]["properties"]
    assert "camera" in properties and "strength" not in properties
    assert "WASD" in properties["camera"]["description"]
