"""Shared pieces of the API fuzzers (tests/integration/test_api_fuzz*.py): settings, the no-5xx check and the
schema-driven loop over a served app's own /openapi.json."""

from __future__ import annotations

import json
import time
from typing import Any, Callable

import httpx
import schemathesis
from hypothesis import HealthCheck, given, settings

from tests.helpers.servers import ThreadServer

FUZZ = settings(derandomize=True, database=None, deadline=None, max_examples=40,
                suppress_health_check=list(HealthCheck), print_blob=True)
SMALL_LIMITS = dict(max_steps=2, max_frames=5, max_pixels=48 * 32, queue_size=64, graceful_shutdown_s=1)


def assert_answered(response: httpx.Response | Any, what: str) -> None:
    """Not a server error; a refusal is in the OpenAI error shape."""
    status = response.status_code
    assert status < 500, f"{what} -> {status}: {response.text[:500]}"
    if status >= 400:
        error = json.loads(response.text)["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["code"], error


def fuzz_operation(operation: Any, server: ThreadServer, timeout: float, what: Callable[[Any], str],
                   fuzz: settings = FUZZ, headers: dict[str, str] | None = None) -> None:
    """Every case hypothesis draws from `operation`'s schema gets an answer from `server`, never a 5xx or a
    dropped connection."""

    @fuzz
    @given(case=operation.as_strategy())
    def run(case: Any) -> None:
        try:
            response = case.call(base_url=server.url, timeout=timeout, headers=headers)
        except Exception as exc:  # requests' ConnectionError: what a crashed handler looks like from outside
            raise AssertionError(f"{what(case)} dropped the connection ({exc!r})") from None
        assert_answered(response, what(case))

    run()


def served_operations(server: ThreadServer, paths: tuple[str, ...]) -> list[Any]:
    """The operations of `server`'s own schema (the served card's option fields included) under `paths`."""
    schema = schemathesis.openapi.from_dict(server.app.openapi())
    operations = [result.ok() for result in schema.get_all_operations()]
    return [op for op in operations if op.path in paths]


def all_videos(client: httpx.Client) -> list[dict[str, Any]]:
    """Every job of the server, page by page."""
    videos: list[dict[str, Any]] = []
    while True:
        params = {"limit": 100, **({"after": videos[-1]["id"]} if videos else {})}
        page = client.get("/v1/videos", params=params).json()
        videos += page["data"]
        if not page["has_more"]:
            return videos


def settled_videos(client: httpx.Client, timeout: float = 60.0) -> list[dict[str, Any]]:
    """Every job, once none is queued or running."""
    deadline = time.monotonic() + timeout
    videos = all_videos(client)
    while any(v["status"] in ("queued", "in_progress") for v in videos):
        assert time.monotonic() < deadline, f"accepted jobs did not finish within {timeout:g} s"
        time.sleep(0.2)
        videos = all_videos(client)
    return videos
