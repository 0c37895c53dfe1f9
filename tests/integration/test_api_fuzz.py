"""Fuzzing the whole HTTP API against real servers: no input a client can send gets a 5xx or a dropped connection.

Two sources of requests, both deterministic (derandomized hypothesis, no example database) and bounded:
- schemathesis, from the app's own OpenAPI schema (every route, path and query parameters, and the JSON and
  multipart bodies the POST routes document through protocol.body_doc);
- hand-written hypothesis strategies for what a schema cannot describe: hostile values in every field (NaN,
  subnormals, 10**400, surrogates, NUL, wrong types), raw multipart parts with invalid UTF-8 and junk files.

The demo Wan server runs with tiny work limits, so a request that passes validation costs milliseconds; chat is
fuzzed on a tiny Cosmos3 with a small KV pool, image edits on a tiny Flux2 Klein, for the same reason. The whole
module runs in under a minute on a 2-core CPU.
"""

from __future__ import annotations

import io
import itertools
import json
import math
from typing import Any, Iterator

import httpx
import pytest
import schemathesis
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from tests.helpers.api_fuzz import FUZZ, SMALL_LIMITS, assert_answered, fuzz_operation, settled_videos
from tests.helpers.servers import ThreadServer
from vidloom.serving.config import ServeConfig

VIDEO_FIELDS = ("prompt", "model", "seconds", "size", "num_frames", "fps", "num_inference_steps", "guidance_scale",
                "flow_shift", "sampler", "seed", "negative_prompt", "step_cache_threshold", "strength",
                "guidance_scale_2", "extend_from", "reason", "sound", "action", "input_reference", "last_image",
                "video", "camera", "c2w", "intrinsics")
IMAGE_FIELDS = ("prompt", "model", "n", "size", "response_format", "output_format", "user", "num_inference_steps",
                "guidance_scale", "flow_shift", "sampler", "seed", "negative_prompt", "mask", "image", "image[]")
CHAT_FIELDS = ("messages", "model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "seed",
               "stop", "n", "stream", "stream_options", "user", "frequency_penalty", "presence_penalty", "logprobs")


def _png(size: tuple[int, int] = (48, 32)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, (200, 30, 30)).save(buf, format="PNG")
    return buf.getvalue()


# -- value strategies ---------------------------------------------------------------------------------------------

NUMBERS = st.one_of(
    st.integers(-3, 20), st.integers(), st.sampled_from([0, -1, 2**63, 2**64, 10**30, 10**400]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([5e-324, 1e-300, 1e-38, 1e-5, 0.5, 0.01, 1.0, 100.0, 1e300, -0.0, math.nan, math.inf]),
)
TEXT = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["", " ", "48x32", "32x32", "0x0", "x", "auto", "a cat", "euler", "unipc", "png", "url",
                     "b64_json", "true", "false", "yes", "nan", "-1", "2", "5", "1e400", "\x00", "\ud800",
                     "video_0123456789abcdef0123456789abcdef", "wan2.1-demo", "data:image/png;base64,AAAA"]),
)
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, TEXT)
JSON_VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
                           max_leaves=6)


def _message() -> st.SearchStrategy[Any]:
    role = st.one_of(st.sampled_from(["user", "system", "assistant", "developer", "tool"]), JSON_VALUES)
    part = st.one_of(
        st.fixed_dictionaries({"type": st.just("text"), "text": TEXT}),
        st.fixed_dictionaries({"type": st.just("image_url"), "image_url": st.one_of(
            st.fixed_dictionaries({"url": st.sampled_from(["data:image/png;base64,AAAA", "https://x/a.png", ""])}),
            JSON_VALUES)}),
        JSON_VALUES,
    )
    content = st.one_of(TEXT, st.lists(part, max_size=3), JSON_VALUES)
    known = st.sampled_from([  # shapes that were 500s once, so every run sends them
        {"role": ["user"], "content": "x"}, {"role": {"name": "user"}, "content": "x"}, {"role": None, "content": "x"},
        {"role": "user", "content": [{"type": ["text"], "text": "x"}]}, {"role": "user", "content": [["text"]]},
        {"role": "developer", "content": {"text": "x"}}, {"role": "user", "content": "x\x00y"},
    ])
    return st.one_of(known, st.fixed_dictionaries({"role": role, "content": content}), JSON_VALUES)


def _json_body(fields: tuple[str, ...], base: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """A plausible body (so deep checks run) with some fields replaced by hostile values, or unknown keys added."""
    overrides = st.dictionaries(st.one_of(st.sampled_from(fields), TEXT), JSON_VALUES, max_size=4)
    drops = st.sets(st.sampled_from(sorted(base)), max_size=2)
    return st.builds(lambda o, d: {**{k: v for k, v in base.items() if k not in d}, **o}, overrides, drops)


RAW_TEXT = st.one_of(
    st.text(max_size=12).map(str.encode),
    st.binary(max_size=12),  # mostly not UTF-8
    st.sampled_from([b"\xff\xfe", b"\xed\xa0\x80", b"caf\xe9", b"\x00", b"true", b"yes", b"5e-324", b"nan",
                     b"48x32", b"2", b"-1", b"1e400", b"9" * 400]),
)
FILES = st.one_of(st.binary(max_size=64), st.sampled_from([_png(), _png((64, 64)), _png((1, 1)), b"GIF89a"]))


FORM_BASE = (("prompt", b"a cat"), ("size", b"48x32"), ("num_inference_steps", b"1"))


def _form_parts(fields: tuple[str, ...], base: tuple[tuple[str, bytes], ...] = FORM_BASE,
                ) -> st.SearchStrategy[list[tuple[str, tuple[Any, ...]]]]:
    """A plausible form (its `base` text fields) plus up to 6 hostile text or file parts."""
    name = st.one_of(st.sampled_from(fields), st.text(max_size=6))
    text_part = st.tuples(name, RAW_TEXT.map(lambda raw: (None, raw)))
    file_part = st.tuples(name, FILES.map(lambda raw: ("f.png", raw, "image/png")))
    plausible = [(key, (None, value)) for key, value in base]
    return st.lists(st.one_of(text_part, file_part), max_size=6).map(lambda extra: plausible + extra)


# -- servers ------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def video_server(demo_engine, tmp_path_factory) -> Iterator[ThreadServer]:
    config = ServeConfig(data_dir=tmp_path_factory.mktemp("fuzz-video"), **SMALL_LIMITS)
    with ThreadServer(demo_engine, config) as running:
        yield running


@pytest.fixture(scope="module")
def chat_server(tmp_path_factory) -> Iterator[ThreadServer]:
    from tests.helpers.cosmos3_checkpoints import write_tiny_cosmos3
    from vidloom.core.deploy import DeployConfig
    from vidloom.generator import VideoGenerator

    folder = write_tiny_cosmos3(tmp_path_factory.mktemp("fuzz-cosmos3") / "cosmos3-tiny")
    # A 128-token pool bounds every accepted request to a few dozen decode steps of the tiny model.
    engine = VideoGenerator.from_pretrained(folder, device="cpu", deploy=DeployConfig(kv_pool_tokens=128)).engine
    config = ServeConfig(data_dir=tmp_path_factory.mktemp("fuzz-chat"), **SMALL_LIMITS)
    with ThreadServer(engine, config) as running:
        yield running


@pytest.fixture(scope="module")
def image_server(flux2_distilled_dir, tmp_path_factory) -> Iterator[ThreadServer]:
    """An image model (Flux2 Klein), where /v1/images/edits decodes its uploads and renders."""
    from vidloom.generator import VideoGenerator

    engine = VideoGenerator.from_pretrained(flux2_distilled_dir, device="cpu").engine
    limits = {**SMALL_LIMITS, "max_steps": 4, "max_pixels": 64 * 64}  # Klein: 4 steps, images >= 64 px a side
    config = ServeConfig(data_dir=tmp_path_factory.mktemp("fuzz-images"), **limits)
    with ThreadServer(engine, config) as running:
        yield running


def _post(client: httpx.Client, path: str, **kwargs: Any) -> httpx.Response:
    try:
        return client.post(path, **kwargs)
    except httpx.TransportError as exc:  # a reset connection is what a crashed handler looks like from outside
        raise AssertionError(f"POST {path} dropped the connection ({exc!r}) for {kwargs}") from None


# -- schema-driven --------------------------------------------------------------------------------------------------

def _operations() -> list[Any]:
    from vidloom.serving.app import create_app

    spec = create_app(None, ServeConfig()).openapi()  # the schema needs no engine (docs are off on servers)
    schema = schemathesis.openapi.from_dict(spec)
    return [result.ok() for result in schema.get_all_operations()]


OPERATIONS = _operations()


def test_the_schema_documents_every_request_body():
    """Without body_doc the routes that read their own body had none in the schema, and nothing to fuzz."""
    from vidloom.serving.app import create_app

    paths = create_app(None, ServeConfig()).openapi()["paths"]
    media = {path: sorted(paths[path]["post"]["requestBody"]["content"])
             for path in ("/v1/videos", "/v1/images/generations", "/v1/images/edits", "/v1/chat/completions")}
    assert media == {"/v1/videos": ["application/json", "multipart/form-data"],
                     "/v1/images/generations": ["application/json"], "/v1/images/edits": ["multipart/form-data"],
                     "/v1/chat/completions": ["application/json"]}
    video = paths["/v1/videos"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert {"prompt", "flow_shift", "input_reference"} <= set(video["properties"])
    chat = paths["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert "$ref" not in str(chat) and "include_usage" in str(chat)  # nested models inlined, not dangling refs


@pytest.mark.parametrize("operation", OPERATIONS, ids=[f"{op.method.upper()} {op.path}" for op in OPERATIONS])
def test_schema_driven_requests_get_no_5xx(video_server: ThreadServer, operation: Any):
    fuzz_operation(operation, video_server, 30,
          lambda case: f"{case.method} {case.formatted_path} {case.query} {str(case.body)[:200]}")


def test_schema_driven_chat_requests_get_no_5xx(chat_server: ThreadServer):
    [operation] = [op for op in OPERATIONS if op.path == "/v1/chat/completions"]
    fuzz_operation(operation, chat_server, 60, lambda case: f"chat {str(case.body)[:300]}")


# -- hostile JSON and multipart bodies ------------------------------------------------------------------------------

BODIES = {
    "/v1/videos": (VIDEO_FIELDS, {"prompt": "a cat", "size": "48x32", "num_frames": 1, "num_inference_steps": 1}),
    "/v1/images/generations": (IMAGE_FIELDS, {"prompt": "a cat", "size": "48x32", "num_inference_steps": 1}),
    "/v1/chat/completions": (CHAT_FIELDS, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
}


EXTREMES = (0, -1, 1, 2, 5e-324, 1e-300, 1e-38, 1e-6, 1e-5, 0.01, 0.5, 1.0, 1.5, 2.0, 100.0, 101, 1e300, 2**64,
            10**400, "nan", "inf", "-inf", "1e-320", "5e-324")
NUMERIC_FIELDS = {
    "/v1/videos": ("seconds", "num_frames", "fps", "num_inference_steps", "guidance_scale", "flow_shift", "seed",
                   "step_cache_threshold", "strength", "guidance_scale_2"),
    "/v1/images/generations": ("n", "num_inference_steps", "guidance_scale", "flow_shift", "seed"),
    "/v1/chat/completions": ("max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "seed", "n",
                             "frequency_penalty", "presence_penalty"),
}


def _numeric_body(path: str, base: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """Several numeric fields at once at extreme or random values: the combinations one field at a time misses."""
    value = st.one_of(st.sampled_from(EXTREMES), NUMBERS)
    fields = st.dictionaries(st.sampled_from(NUMERIC_FIELDS[path]), value, min_size=1, max_size=3)
    seconds_based = st.booleans() if path == "/v1/videos" else st.just(False)
    return st.builds(lambda f, s: {**base, **({"num_frames": None, "seconds": "0.25"} if s else {}), **f},
                     fields, seconds_based)


@pytest.mark.parametrize("path", sorted(BODIES))
def test_hostile_json_bodies_get_no_5xx(video_server: ThreadServer, chat_server: ThreadServer, path: str):
    fields, base = BODIES[path]
    url = chat_server.url if "chat" in path else video_server.url
    messages = st.lists(_message(), max_size=3)
    body = st.one_of(_json_body(fields, base), _numeric_body(path, base))
    if "chat" in path:
        body = st.builds(lambda b, m, use: {**b, "messages": m} if use else b, body, messages, st.booleans())
    with httpx.Client(base_url=url, timeout=60) as client:
        @FUZZ
        @given(body=body)
        def run(body: dict[str, Any]) -> None:
            content = json.dumps(body, allow_nan=True).encode()  # NaN / Infinity literals too: Python reads them
            response = _post(client, path, content=content, headers={"content-type": "application/json"})
            assert_answered(response, f"POST {path} {content[:300]!r}")

        run()


FORM_TEXT = st.one_of(TEXT, st.from_regex(r"-?[0-9]{0,4}(\.[0-9]{0,3})?(e-?[0-9]{1,3})?", fullmatch=True)).filter(
    lambda t: "\x00" not in t and t.encode("utf-8", "surrogatepass").decode("utf-8", "replace") == t)


@settings(FUZZ, max_examples=60)
@given(fields=st.dictionaries(st.sampled_from(VIDEO_FIELDS), FORM_TEXT, min_size=1, max_size=3))
def test_json_and_form_bodies_get_one_answer(video_server: ThreadServer, fields: dict[str, str]):
    """The same text values sent as JSON strings and as form fields: the same refusal, or both accepted."""
    body = {"prompt": "a cat", "size": "48x32", "num_frames": "1", "num_inference_steps": "1", **fields}
    with httpx.Client(base_url=video_server.url, timeout=30) as client:
        as_json = _post(client, "/v1/videos", json=body)
        as_form = _post(client, "/v1/videos", files=[(k, (None, v.encode())) for k, v in body.items()])
        for accepted in (r for r in (as_json, as_form) if r.status_code == 200):  # only the answer matters here
            client.delete(f"/v1/videos/{accepted.json()['id']}")
    if as_json.status_code not in (200, 429):  # a refusal: the same status and error body
        assert (as_form.status_code, as_form.json()) == (as_json.status_code, as_json.json()), (body, as_form.text)
    else:
        assert {as_json.status_code, as_form.status_code} <= {200, 429}, (body, as_json.text, as_form.text)


@pytest.mark.parametrize("path", ["/v1/videos", "/v1/images/edits", "/v1/images/generations", "/v1/chat/completions"])
def test_hostile_multipart_bodies_get_no_5xx(video_server: ThreadServer, chat_server: ThreadServer, path: str):
    fields = CHAT_FIELDS if "chat" in path else IMAGE_FIELDS if "images" in path else VIDEO_FIELDS
    url = chat_server.url if "chat" in path else video_server.url
    with httpx.Client(base_url=url, timeout=60) as client:
        @FUZZ
        @given(parts=_form_parts(fields))
        def run(parts: list[tuple[str, tuple[Any, ...]]]) -> None:
            response = _post(client, path, files=parts)
            assert_answered(response, f"POST {path} multipart {[(n, p[1][:40]) for n, p in parts]}")

        run()


@pytest.mark.parametrize("path", ["/v1/images/edits", "/v1/images/generations"])
def test_image_model_routes_get_no_5xx(image_server: ThreadServer, path: str):
    """Edits on a model that takes reference images: the uploads are decoded and the render runs."""
    with httpx.Client(base_url=image_server.url, timeout=60) as client:
        @settings(FUZZ, max_examples=20)
        @given(parts=_form_parts(IMAGE_FIELDS, (("prompt", b"a cat"),)), images=st.lists(FILES, max_size=5))
        def run(parts: list[tuple[str, tuple[Any, ...]]], images: list[bytes]) -> None:
            parts = parts + [("image", ("i.png", raw, "image/png")) for raw in images]
            response = _post(client, path, files=parts)
            assert_answered(response, f"POST {path} multipart {[(n, p[1][:40]) for n, p in parts]}")

        run()


RAW_CONTENT_TYPES = ("application/json", "multipart/form-data; boundary=xyz", "multipart/form-data",
                     "multipart/form-data; boundary=", "multipart/form-data; boundary=xyz; charset=latin-1")


RAW_BODIES = st.one_of(st.binary(max_size=64), st.sampled_from([
    b"", b"{", b"[]", b"null", b"1e999", b"[" * 5000, b'{"prompt": "\\ud800"}', b'{"a": NaN}', b"--xyz--\r\n",
    b'--xyz\r\nContent-Disposition: form-data; name="prompt"\r\n\r\na cat\r\n--xyz--\r\n',
    b'--xyz\r\nContent-Disposition: form-data\r\n\r\nnameless\r\n--xyz--\r\n',
    b'--xyz\r\nContent-Disposition: form-data; name="prompt"\r\n\r\nunterminated']))


def test_raw_bytes_get_no_5xx(video_server: ThreadServer):
    with httpx.Client(base_url=video_server.url, timeout=30) as client:
        @settings(FUZZ, max_examples=50)
        @given(raw=RAW_BODIES, content_type=st.sampled_from(RAW_CONTENT_TYPES),
               path=st.sampled_from([*BODIES, "/v1/images/edits"]))
        def run(raw: bytes, content_type: str, path: str) -> None:
            response = _post(client, path, content=raw, headers={"content-type": content_type})
            assert_answered(response, f"{path} {content_type} {raw!r}")

        run()
        assert client.get("/health").status_code == 200


@pytest.mark.parametrize("path", sorted(NUMERIC_FIELDS))
def test_every_numeric_field_at_its_extremes(video_server: ThreadServer, chat_server: ThreadServer, path: str):
    """Each numeric field alone at each boundary value (subnormals, 0, huge, NaN/inf as JSON literals and as
    strings) is refused with a 400 or runs: the grid a random search reaches only by luck."""
    _, base = BODIES[path]
    # Videos also from `seconds` (frames = seconds * fps): num_frames in the base would skip that product.
    bases = [base, {**base, "num_frames": None, "seconds": "0.25"}] if path == "/v1/videos" else [base]
    url = chat_server.url if "chat" in path else video_server.url
    with httpx.Client(base_url=url, timeout=60) as client:
        for field, value, body in itertools.product(NUMERIC_FIELDS[path], EXTREMES, bases):
            literal = json.dumps(float(value) if value in ("nan", "inf", "-inf") else value, allow_nan=True)
            content = json.dumps(body)[:-1].encode() + f', "{field}": {literal}}}'.encode()  # a later key wins
            response = _post(client, path, content=content, headers={"content-type": "application/json"})
            assert_answered(response, f"POST {path} {content[:200]!r}")


def test_every_job_the_fuzzing_got_accepted_completes(video_server: ThreadServer):
    """Accepted means it runs: a value that passes validation must not fail the job later (flow_shift 5e-324
    was accepted and ended non_finite_output). Runs after the fuzz tests above, on the same server."""
    with httpx.Client(base_url=video_server.url, timeout=30) as client:
        # One job of our own, so the check has something to wait for when this test runs alone.
        assert client.post("/v1/videos", json={"prompt": "a cat", "size": "48x32", "num_frames": 1,
                                               "num_inference_steps": 1}).status_code == 200
        videos = settled_videos(client)
    failed = [(v["parameters"], v["error"]) for v in videos if v["status"] != "completed"]
    assert not failed, failed[:3]
