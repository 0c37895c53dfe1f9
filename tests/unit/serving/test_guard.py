"""The request guards as plain functions: Host names, API key, Origin and content-type decisions."""

from __future__ import annotations

import pytest

from vidloom.serving import api_keys
from vidloom.serving.config import ServeConfig
from vidloom.serving.guard import HostGuard, RequestGuard, host_name


def _scope(method: str = "GET", path: str = "/v1/videos", **headers: str) -> dict:
    raw = [(name.replace("_", "-").encode(), value.encode("latin-1")) for name, value in headers.items()]
    return {"type": "http", "method": method, "path": path, "headers": raw}


@pytest.mark.parametrize(("header", "name"), [
    ("localhost:8000", "localhost"), ("[::1]:8000", "::1"), ("[::1]", "::1"), ("Example.COM.", "example.com"),
    ("10.0.0.5:80", "10.0.0.5"), ("::1", "::1"),
])
def test_host_name(header: str, name: str):
    assert host_name(header) == name


@pytest.mark.parametrize(("config", "header", "allowed"), [
    ({}, "localhost:8000", True),
    ({}, "127.0.0.1:8000", True),
    ({}, "[::1]:8000", True),
    ({}, "192.168.1.20:8000", True),  # an IP literal cannot be a rebinding attack's name
    ({}, "evil.example", False),
    ({}, "localhost.evil.example", False),
    ({"host": "0.0.0.0"}, "0.0.0.0", True),  # an IP literal
    ({"host": "myhost"}, "myhost:8000", True),  # the bind address
    ({"allowed_hosts": ("API.example.com",)}, "api.example.com:443", True),
    ({"allowed_hosts": ("api.example.com",)}, "other.example.com", False),
    ({"allowed_hosts": ("*",)}, "anything.example", True),
])
def test_host_guard(config: dict, header: str, allowed: bool):
    assert HostGuard(None, ServeConfig(**config)).allows(header) is allowed  # type: ignore[arg-type]


def test_api_key_is_compared_in_constant_time(monkeypatch):
    calls = []

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return a == b

    monkeypatch.setattr(api_keys.hmac, "compare_digest", spy)  # every key is compared (api_keys.KeyRing)
    check = RequestGuard(None, ServeConfig(api_key="sekrit"))  # type: ignore[arg-type]
    assert check.refusal(_scope(authorization="Bearer sekrit")) is None
    assert check.refusal(_scope(authorization="bearer  sekrit ")) is None  # scheme is case-insensitive
    assert calls == [(b"sekrit", b"sekrit")] * 2
    for header in ({"authorization": "Bearer wrong"}, {"authorization": "Basic c2Vrcml0"}, {}):
        status, message, code = check.refusal(_scope(**header))
        assert (status, code) == (401, "invalid_api_key") and "wrong" not in message


def test_open_paths_need_no_key():
    check = RequestGuard(None, ServeConfig(api_key="k"))  # type: ignore[arg-type]
    assert check.refusal(_scope(path="/health")) is None
    assert check.refusal(_scope(path="/metrics")) is None
    assert check.refusal(_scope(path="/openapi.json"))[0] == 401  # docs are off: not open either
    strict = RequestGuard(None, ServeConfig(api_key="k", metrics_need_key=True))  # type: ignore[arg-type]
    assert strict.refusal(_scope(path="/metrics"))[0] == 401


@pytest.mark.parametrize(("headers", "status"), [
    ({"content_type": "application/json"}, None),
    ({"content_type": "application/json; charset=utf-8"}, None),
    ({"content_type": "multipart/form-data; boundary=x"}, None),
    ({"content_type": "text/plain"}, 415),
    ({"content_type": "application/x-www-form-urlencoded"}, 415),
    ({"content_length": "0"}, None),  # e.g. POST .../cancel without a body
    ({}, None),
    ({"content_length": "12"}, 415),  # a body of unstated type
    ({"content_type": "application/json", "origin": "https://evil.example"}, 403),
    ({"content_type": "application/json", "origin": "null"}, 403),
    ({"content_type": "application/json", "origin": "http://127.0.0.1:8000", "host": "127.0.0.1:8000"}, None),
])
def test_post_origin_and_content_type(headers: dict, status: int | None):
    refusal = RequestGuard(None, ServeConfig()).refusal(_scope("POST", **headers))  # type: ignore[arg-type]
    assert (refusal[0] if refusal else None) == status


def test_cors_origins_may_write():
    check = RequestGuard(None, ServeConfig(cors_origins=("https://app.example.com/",)))  # type: ignore[arg-type]
    ok = _scope("POST", content_type="application/json", origin="https://app.example.com")
    assert check.refusal(ok) is None
    assert check.refusal(_scope("DELETE", origin="https://other.example.com"))[0] == 403


@pytest.mark.parametrize(("setting", "value"), [
    ("api_key", ""), ("api_key", "  "), ("api_key", "ключ"),
    ("allowed_hosts", ("a b",)), ("cors_origins", ("app.com",)),
])
def test_bad_security_settings_name_themselves(setting: str, value: object):
    with pytest.raises(ValueError, match=setting):
        ServeConfig(**{setting: value})
