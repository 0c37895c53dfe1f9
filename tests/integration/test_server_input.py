"""Client input never gets a 5xx: form text is strict Unicode, fields are counted, booleans are true/false, numbers
that make the math degenerate are refused; and a JSON body and the same fields as a form get the same answer."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.helpers.servers import SMALL
from vidloom.serving.form_body import MAX_FORM_FIELDS

BASE = {"prompt": "a cat", **SMALL}


def _form(client: httpx.Client, fields: dict[str, bytes | str], path: str = "/v1/videos") -> httpx.Response:
    parts = [(name, (None, value.encode() if isinstance(value, str) else value)) for name, value in fields.items()]
    return client.post(path, files=parts)


def _error(response: httpx.Response, status: int = 400) -> dict:
    assert response.status_code == status, response.text
    return response.json()["error"]


@pytest.mark.parametrize("raw", [b"\xff\xfe a cat", b"a \xed\xa0\x80 cat", b"caf\xe9"])  # latin-1, surrogate, cp1252
def test_form_text_that_is_not_utf8_is_refused_naming_the_field(client: httpx.Client, raw: bytes):
    # Starlette decoded these as latin-1: the job ran and stored the prompt as mojibake ("ÿþ a cat").
    error = _error(_form(client, {**{k: str(v) for k, v in SMALL.items()}, "prompt": raw}))
    assert error["param"] == "prompt" and error["code"] == "invalid_parameter"
    assert "not valid utf-8 text" in error["message"]
    assert client.get("/health").status_code == 200


def test_form_text_in_utf8_is_kept_exactly(client: httpx.Client):
    prompt = "un renard roux, café ☕ 🦊"
    response = _form(client, {**{k: str(v) for k, v in SMALL.items()}, "prompt": prompt})
    assert response.status_code == 200, response.text
    assert response.json()["prompt"] == prompt


def test_a_field_name_that_is_not_utf8_is_refused(client: httpx.Client):
    body = (b"--b\r\nContent-Disposition: form-data; name=\"pr\xffompt\"\r\n\r\na cat\r\n--b--\r\n")
    error = _error(client.post("/v1/videos", content=body, headers={"content-type": "multipart/form-data; boundary=b"}))
    assert error["code"] == "invalid_parameter" and "form field name" in error["message"]


@pytest.mark.parametrize("count", [MAX_FORM_FIELDS + 1, 1001])
def test_too_many_form_fields_is_a_named_limit(client: httpx.Client, count: int):
    # More than 1000 fields used to be starlette's bare HTTPException: 400 with code null.
    fields = {"prompt": "a cat", **{f"f{i}": "1" for i in range(count - 1)}}
    error = _error(_form(client, fields))
    assert error["code"] == "limit_exceeded" and "max_form_fields" in error["message"]


def test_an_unknown_form_charset_is_a_form_error(client: httpx.Client):
    body = b"--b\r\nContent-Disposition: form-data; name=\"prompt\"\r\n\r\na cat\r\n--b--\r\n"
    headers = {"content-type": "multipart/form-data; boundary=b; charset=klingon"}
    assert _error(client.post("/v1/videos", content=body, headers=headers))["code"] == "invalid_form"


@pytest.mark.parametrize("field", ["prompt", "negative_prompt", "size"])
def test_nul_characters_are_refused_in_json_and_forms(client: httpx.Client, field: str):
    # PostgreSQL text cannot hold U+0000: a stored prompt with one was a 503 from the job store.
    body = {**BASE, field: "a\x00b"}
    assert _error(client.post("/v1/videos", json=body))["param"] == field
    assert _error(_form(client, {k: str(v) for k, v in body.items()}))["param"] == field


@pytest.mark.parametrize("value", ["yes", "on", 1, "1", "True"])
def test_booleans_are_only_true_or_false(client: httpx.Client, value: object):
    body = {"messages": [{"role": "user", "content": "x"}]}  # a served model's own switches: test_option_fields
    error = _error(client.post("/v1/chat/completions", json={**body, "stream": value}))
    assert error["param"] == "stream" and "must be true or false" in error["message"]


@pytest.mark.parametrize("field", ["reason", "sound"])
def test_another_models_switch_is_refused_on_and_dropped_off(client: httpx.Client, field: str):
    # The demo model has no reasoning or sound block: on is refused with the reason, off is "not given".
    fields = {**{k: str(v) for k, v in BASE.items()}}
    for on in (_form(client, {**fields, field: "true"}), client.post("/v1/videos", json={**BASE, field: "yes"})):
        error = _error(on)
        assert error["param"] == field and f"does not take {field}: it has no" in error["message"]
    assert _form(client, {**fields, field: "false"}).status_code == 200
    assert client.post("/v1/videos", json={**BASE, field: False}).status_code == 200


@pytest.mark.parametrize(("field", "value"), [
    ("flow_shift", 5e-324), ("flow_shift", 1e-300), ("flow_shift", 0.001), ("flow_shift", 101),
    ("guidance_scale", 1e300), ("guidance_scale_2", 1e300), ("strength", 5e-324),
    ("step_cache_threshold", 1e300), ("fps", 10**30), ("seed", 2**64), ("num_inference_steps", 10**30),
])
def test_degenerate_numbers_are_400_naming_the_field(client: httpx.Client, field: str, value: object):
    # flow_shift 5e-324 used to be accepted; the job then failed with non_finite_output.
    body = {k: v for k, v in BASE.items() if not (field == "seconds" and k == "num_frames")}
    error = _error(client.post("/v1/videos", json={**body, field: value}))
    assert error["param"] == field


@pytest.mark.parametrize(("field", "value"), [
    ("num_inference_steps", "many"), ("num_inference_steps", "2.5"), ("guidance_scale", "nan"),
    ("guidance_scale", "Infinity"), ("flow_shift", "5e-324"), ("seed", "-1"), ("fps", "0"), ("size", "47x32"),
    ("seconds", "soon"), ("num_frame", "5"), ("reason", "yes"), ("input_reference", "file-123"), ("prompt", " "),
])
def test_json_and_form_give_the_same_answer(client: httpx.Client, field: str, value: str):
    body = {**{k: str(v) for k, v in BASE.items()}, field: value}
    as_json, as_form = client.post("/v1/videos", json=body), _form(client, body)
    assert as_json.status_code == as_form.status_code == 400, (as_json.text, as_form.text)
    assert as_json.json() == as_form.json()
    assert as_json.json()["error"]["param"] == field


def test_nan_literals_in_json_are_refused_by_field(client: httpx.Client):
    content = json.dumps({**BASE, "guidance_scale": float("nan")}).encode()  # Python writes the NaN literal
    error = _error(client.post("/v1/videos", content=content, headers={"content-type": "application/json"}))
    assert error["param"] == "guidance_scale"
