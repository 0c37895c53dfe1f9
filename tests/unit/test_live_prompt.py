"""LivePrompts (a running request's pending prompt) and the live prompt WebSocket's message rules."""

from __future__ import annotations

import pytest

from vidloom.core.errors import InvalidRequest
from vidloom.core.live_prompt import LivePrompts
from vidloom.serving.live_prompt_routes import parse_prompt


def test_a_prompt_is_kept_only_for_a_running_request_and_taken_once():
    prompts = LivePrompts()
    assert not prompts.set("r1", "a boat")  # not running yet: nothing kept
    prompts.open("r1")
    assert prompts.take("r1") is None
    assert prompts.set("r1", "a boat") and prompts.set("r1", "a fox")  # the newest replaces one not yet taken
    assert prompts.take("r1") == "a fox" and prompts.take("r1") is None
    prompts.close("r1")
    assert not prompts.set("r1", "a cat") and prompts.running() == 0


@pytest.mark.parametrize(("message", "field"), [
    ({"bytes": b"x"}, "message"),
    ({"text": "not json"}, "message"),
    ({"text": "[1]"}, "message"),
    ({"text": '{"prompt": "a", "seed": 1}'}, "seed"),
    ({"text": '{"prompt": "  "}'}, "prompt"),
    ({"text": '{"prompt": 3}'}, "prompt"),
    ({"text": '{"prompt": "a\\u0000b"}'}, "prompt"),
])
def test_bad_messages_are_refused_naming_the_field(message, field):
    with pytest.raises(InvalidRequest) as err:
        parse_prompt(message)
    assert err.value.field == field


def test_a_prompt_message_gives_its_prompt():
    assert parse_prompt({"text": '{"prompt": "a red fox"}'}) == "a red fox"
