"""The API fuzzers pointed at the routes and bodies of other model kinds: each served app's own /openapi.json,
with the card's option fields (SANA-WM's camera, c2w, intrinsics; Stable Audio's seconds, seconds_start), speech,
world-model sessions and the LoRA admin routes. No input gets a 5xx or a dropped connection.

Deterministic (derandomized hypothesis, no example database) and bounded: tiny demos with small work limits, so a
request that passes validation costs milliseconds; speech runs under a one-second request budget.
"""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import quote

import httpx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from tests.helpers.api_fuzz import (FUZZ, SMALL_LIMITS, assert_answered, fuzz_operation, served_operations,
                                    settled_videos)
from tests.helpers.servers import ThreadServer
from vidloom.serving.config import ServeConfig

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
ADMIN = "sk-fuzz-admin"
AUTH = {"Authorization": f"Bearer {ADMIN}"}
FEW = settings(FUZZ, max_examples=15)


def _data_url(size: tuple[int, int] = (48, 32)) -> str:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(3).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(
        buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _serve(engine: Any, tmp_path_factory: pytest.TempPathFactory, name: str, **settings: Any) -> ThreadServer:
    config = ServeConfig(data_dir=tmp_path_factory.mktemp(name), **{**SMALL_LIMITS, **settings})
    return ThreadServer(engine, config)


def _demo(name: str, demo_cache: Path, **kwargs: Any) -> Any:
    from vidloom.generator import VideoGenerator

    return VideoGenerator.from_pretrained(name, device="cpu", cache_dir=demo_cache, **kwargs).engine


# -- servers ------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def sana_server(demo_cache, tmp_path_factory) -> Iterator[ThreadServer]:
    # SANA-WM's VAE: 8k+1 frames, 64 px a side at least; one step of 9 frames at 64x64 takes ~0.3 s.
    with _serve(_demo("sana-wm-demo", demo_cache), tmp_path_factory, "fuzz-sana", max_frames=9,
                max_pixels=64 * 64) as running:
        yield running


@pytest.fixture(scope="module")
def audio_server(demo_cache, tmp_path_factory) -> Iterator[ThreadServer]:
    pytest.importorskip("torchsde")
    with _serve(_demo("stable-audio-demo", demo_cache), tmp_path_factory, "fuzz-audio") as running:
        yield running


@pytest.fixture(scope="module")
def speech_server(demo_cache, tmp_path_factory) -> Iterator[ThreadServer]:
    # Three seconds per speech run: a long random `input` is refused up front or stopped, never minutes of talker.
    with _serve(_demo("qwen-omni-demo", demo_cache), tmp_path_factory, "fuzz-speech",
                max_request_seconds=3.0) as running:
        yield running


@pytest.fixture(scope="module")
def session_server(demo_cache, tmp_path_factory) -> Iterator[ThreadServer]:
    from vidloom.core.deploy import DeployConfig

    engine = _demo("cosmos3-action-demo", demo_cache, deploy=DeployConfig(kv_session_ttl_s=600))
    with _serve(engine, tmp_path_factory, "fuzz-sessions", max_pixels=None, max_frames=None) as running:
        yield running


@pytest.fixture(scope="module")
def lora_server(flux2_distilled_dir, tmp_path_factory) -> Iterator[tuple[ThreadServer, str]]:
    """Flux2 Klein with an admin key and one adapter in its --lora-dir (so a fuzzed load can succeed)."""
    from tests.helpers.lora_files import LoRASpec, write_lora
    from vidloom.generator import VideoGenerator

    engine = VideoGenerator.from_pretrained(flux2_distilled_dir, device="cpu", max_loras=1).engine
    spec = LoRASpec(rank=4, alpha=8, targets=("to_q", "to_k"), seed=5)
    lora = write_lora(flux2_distilled_dir, "Flux2KleinPipeline", spec, tmp_path_factory.mktemp("fuzz-loras"))
    with _serve(engine, tmp_path_factory, "fuzz-lora", api_key=ADMIN, lora_dirs=(lora.parent,), max_lora_rank=8,
                max_lora_file_bytes=lora.stat().st_size + 4096, max_pixels=64 * 64, max_steps=4) as running:
        yield running, lora.name


# -- the served schemas -----------------------------------------------------------------------------------------------

def _body_fields(server: ThreadServer, path: str) -> set[str]:
    content = server.app.openapi()["paths"][path]["post"]["requestBody"]["content"]
    return set(content["application/json"]["schema"]["properties"])


def test_the_served_schemas_carry_each_models_options(sana_server, audio_server, speech_server):
    assert {"camera", "c2w", "intrinsics", "input_reference"} <= _body_fields(sana_server, "/v1/videos")
    assert {"seconds", "seconds_start"} <= _body_fields(audio_server, "/v1/audio/generations")
    assert {"input", "voice", "speed"} <= _body_fields(speech_server, "/v1/audio/speech")


def _describe(case: Any) -> str:
    return f"{case.method} {case.formatted_path} {case.query} {str(case.body)[:300]}"


SCHEMA_RUNS = {  # server fixture -> (paths fuzzed from its schema, settings)
    "sana_server": (("/v1/videos",), FUZZ),
    "audio_server": (("/v1/audio/generations",), FUZZ),
    "speech_server": (("/v1/audio/speech",), FEW),
    "session_server": (("/v1/sessions", "/v1/sessions/{session_id}"), FEW),
}


@pytest.mark.parametrize("fixture", sorted(SCHEMA_RUNS))
def test_schema_driven_requests_get_no_5xx(request, fixture: str):
    server = request.getfixturevalue(fixture)
    paths, fuzz = SCHEMA_RUNS[fixture]
    operations = served_operations(server, paths)
    assert {op.path for op in operations} == set(paths)
    for operation in operations:
        fuzz_operation(operation, server, 60, _describe, fuzz)


def test_schema_driven_lora_admin_requests_get_no_5xx(lora_server):
    server, _ = lora_server
    operations = served_operations(server, ("/v1/loras", "/v1/loras/{name}"))
    assert {(op.method.upper(), op.path) for op in operations} == {
        ("GET", "/v1/loras"), ("POST", "/v1/loras"), ("DELETE", "/v1/loras/{name}")}
    for operation in operations:
        fuzz_operation(operation, server, 60, _describe, FEW, headers=AUTH)


# -- hostile values in the option fields, on a body that is otherwise valid ------------------------------------------

NUMBERS = st.one_of(st.integers(-3, 20), st.integers(), st.floats(),
                    st.sampled_from([0, -1, 5e-324, 1e-38, 1e38, 1e300, 2**64, 10**400, "nan", "1e400"]))
TEXT = st.one_of(st.text(max_size=10), st.sampled_from(["", "w-8", "w-²", "w-" + "9" * 5000, "w-99999", "jw-3,s-2",
                                                         "\ud800", "\x00", "none-3"]))
VALUES = st.recursive(st.one_of(st.none(), st.booleans(), NUMBERS, TEXT),
                      lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=2),
                      max_leaves=16)
POSE = np.eye(4).tolist()


def _mostly(good: list[Any], hostile: st.SearchStrategy[Any] = VALUES) -> st.SearchStrategy[Any]:
    """A valid value two times in three (so the other fields' deeper checks run), else a hostile one."""
    return st.one_of(st.sampled_from(good), st.sampled_from(good), hostile)


INTRINSICS = _mostly([[100.0, 100.0, 32.0, 32.0], [[100.0, 0, 32.0], [0, 100.0, 32.0], [0, 0, 1]]],
                     st.one_of(st.lists(NUMBERS, min_size=4, max_size=4), VALUES))
C2W = _mostly([[POSE] * 9, [POSE]], st.one_of(st.lists(st.just(POSE), max_size=12), VALUES, st.sampled_from(
    [[[[10**400] * 4] * 4], [[POSE[0]] * 4], [[[1e38] * 4] * 4], [[[0.0] * 4] * 4]])))
CAMERA_FIELDS = st.one_of(  # an action string, or poses, or any mix of the three fields
    st.fixed_dictionaries({"camera": _mostly(["w-8", "jw-4,s-4", "none-8", "ik-2,dl-6", "W-3，a-5"], TEXT)},
                          optional={"intrinsics": INTRINSICS}),
    st.fixed_dictionaries({"c2w": C2W}, optional={"intrinsics": INTRINSICS}),
    st.fixed_dictionaries({}, optional={"camera": VALUES, "c2w": C2W, "intrinsics": INTRINSICS}),
)
AUDIO_FIELDS = st.fixed_dictionaries({}, optional={
    "seconds": _mostly([0.25, 0.5, 0.00005, 1.0, 1.024], st.one_of(NUMBERS, VALUES)),
    "seconds_start": _mostly([0, 0.5, 1.0, 1.024], st.one_of(NUMBERS, VALUES)),
    "num_inference_steps": _mostly([1, 2], NUMBERS), "seed": _mostly([1, 2], NUMBERS),
})
SPEECH_FIELDS = st.fixed_dictionaries({}, optional={
    "input": _mostly(["hi", "ok", "a b"], st.one_of(TEXT, VALUES)),
    "voice": _mostly(["Chelsie", "Ethan", {"id": "Ethan"}]), "speed": _mostly([0.25, 1.0, 4.0], NUMBERS),
    "instructions": _mostly(["softly"], st.one_of(TEXT, VALUES)),
    "response_format": _mostly(["wav", "pcm", "flac"], TEXT),
    "stream_format": _mostly(["audio", "sse"], TEXT), "seed": _mostly([1, 2], NUMBERS),
})
SESSION_FIELDS = st.fixed_dictionaries({}, optional={
    name: _mostly(good) for name, good in (
        ("mode", ["policy", "forward_dynamics", "inverse_dynamics"]), ("domain_name", ["pusht", "av", "nope"]),
        ("chunk_size", [4, 8, 5, 10**400]), ("view_point", ["ego_view", "wrist_view"]),
        ("resolution_tier", [256, 480, 1]), ("num_inference_steps", [1, 2, 0]), ("fps", [4, 0, 1e300]),
        ("input_reference", [_data_url(), "data:image/png;base64,AAAA", ""]), ("seed", [0, -1, 2**64]))})
OPEN = {"prompt": "push the block", "domain_name": "pusht", "chunk_size": 4, "resolution_tier": 256,
        "num_inference_steps": 1, "input_reference": _data_url((64, 48))}


def _form_value(value: Any) -> bytes:
    """A form field's bytes: text as sent (a lone surrogate as the invalid UTF-8 it becomes), the rest as JSON."""
    text = value if isinstance(value, str) else json.dumps(value, allow_nan=True)
    return text.encode("utf-8", "surrogatepass")


def _post_bodies(server: ThreadServer, path: str, base: dict[str, Any], fields: st.SearchStrategy[dict[str, Any]],
                 form: bytes | None = None, after=None) -> None:
    """POST `base` with `fields` drawn over it (as JSON, or as a form with `form` uploaded as input_reference):
    never a 5xx; `after(client, response)` cleans up an accepted one."""
    with httpx.Client(base_url=server.url, timeout=60, headers=AUTH) as client:
        @FUZZ
        @given(fields=fields)
        def run(fields: dict[str, Any]) -> None:
            body = {**base, **fields}
            if form is None:
                content = json.dumps(body, allow_nan=True).encode()
                sent = dict(content=content, headers={"content-type": "application/json"})
            else:
                parts = [(k, (None, _form_value(v))) for k, v in body.items()]
                sent = dict(files=[*parts, ("input_reference", ("first.png", form, "image/png"))])
            try:
                response = client.post(path, **sent)
            except httpx.TransportError as exc:
                raise AssertionError(f"POST {path} dropped the connection ({exc!r}) for {body!r:.300}") from None
            assert_answered(response, f"POST {path} {body!r:.300}")
            if after is not None and response.status_code == 200:
                after(client, response)

        run()
        assert client.get("/health").status_code == 200


def _png(size: tuple[int, int]) -> bytes:
    return base64.b64decode(_data_url(size).partition(",")[2])


def test_hostile_camera_fields_get_no_5xx(sana_server):
    base = {"prompt": "a road", "size": "64x64", "num_frames": 9, "num_inference_steps": 1,
            "intrinsics": [100.0, 100.0, 32.0, 32.0]}
    sizes = st.fixed_dictionaries({}, optional={"size": _mostly(["64x64"], st.sampled_from(["64x32", "32x64"]))})
    drawn = st.builds(lambda camera, size: {**camera, **size}, CAMERA_FIELDS, sizes)
    known = st.sampled_from([{"camera": "w-8", "size": "64x32"}, {"camera": "w-8", "size": "32x64"}])  # once jobs
    fields = st.one_of(drawn, drawn, drawn, known)  # that failed in the VAE after they were accepted
    _post_bodies(sana_server, "/v1/videos", base, fields, form=_png((64, 64)))
    with httpx.Client(base_url=sana_server.url, timeout=30) as client:  # accepted means it runs (64x32 did not)
        videos = settled_videos(client)
    failed = [(v["parameters"], v["error"]) for v in videos if v["status"] != "completed"]
    assert videos and not failed, failed[:3]


def test_hostile_audio_fields_get_no_5xx(audio_server):
    _post_bodies(audio_server, "/v1/audio/generations", {"prompt": "rain", "seconds": 0.25, "num_inference_steps": 1},
                 AUDIO_FIELDS)


def test_hostile_speech_fields_get_no_5xx(speech_server):
    _post_bodies(speech_server, "/v1/audio/speech", {"input": "hi", "response_format": "wav"}, SPEECH_FIELDS)


def test_hostile_session_fields_get_no_5xx(session_server):
    def close(client: httpx.Client, response: httpx.Response) -> None:
        assert client.delete(f"/v1/sessions/{response.json()['id']}").status_code == 200

    _post_bodies(session_server, "/v1/sessions", OPEN, SESSION_FIELDS, after=close)


LORA_NAMES = st.one_of(st.sampled_from(["boat", "a" * 64, "a" * 65, "a/b", "..", ".", "-x", "x.y_z"]), TEXT)
LORA_PATHS = st.one_of(st.sampled_from(["../x.safetensors", "/etc/passwd", "/proc/self/environ", ".", "",
                                        "nope.safetensors", "a\x00b", "~/x"]), TEXT)


def test_hostile_lora_admin_requests_get_no_5xx(lora_server):
    """Loads (hostile names and paths, and the real file), deletes of any name; an adapter that
    loads is deleted again."""
    server, lora = lora_server
    fields = st.fixed_dictionaries({}, optional={"name": _mostly(["boat", "x.y_z"], LORA_NAMES),
                                                 "path": _mostly([lora], LORA_PATHS)})

    def unload(client: httpx.Client, response: httpx.Response) -> None:
        assert client.delete(f"/v1/loras/{response.json()['name']}").status_code == 200

    _post_bodies(server, "/v1/loras", {"name": "boat", "path": lora}, fields, after=unload)
    with httpx.Client(base_url=server.url, timeout=60, headers=AUTH) as client:
        @FUZZ
        @given(name=LORA_NAMES)
        def delete(name: str) -> None:
            url = "/v1/loras/" + quote(name.encode("utf-8", "surrogatepass"), safe="")  # "a/b" as a%2Fb
            assert_answered(client.delete(url), f"DELETE /v1/loras/{name!r}")

        delete()
