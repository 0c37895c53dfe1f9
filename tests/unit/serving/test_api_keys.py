"""Keys files and the card's api_keys: roles, owners, one secret per owner, errors naming the file and line."""

from __future__ import annotations

from pathlib import Path

import pytest

from vidloom.serving.api_keys import ANONYMOUS, OPEN, ApiKey, Caller, KeyRing, read_keys_file
from vidloom.serving.config import ServeConfig
from vidloom.serving.guard import RequestGuard


def _scope(token: str | None, path: str = "/v1/videos") -> dict:
    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    return {"type": "http", "method": "GET", "path": path, "headers": headers}


def test_a_keys_file_of_lines_or_json_gives_each_key_its_role_and_owner(tmp_path: Path):
    lines = tmp_path / "keys.txt"
    lines.write_text("# key role owner\n\nsk-a user alice   # the web app\nsk-o admin ops\n")
    assert read_keys_file(lines) == (ApiKey("sk-a", "user", "alice"), ApiKey("sk-o", "admin", "ops"))
    listed = tmp_path / "keys.json"
    listed.write_text('[{"key": "sk-b", "role": "user", "owner": "bob@example.com"}]')
    assert read_keys_file(listed) == (ApiKey("sk-b", "user", "bob@example.com"),)
    ring = ServeConfig(api_key="sk-root", api_keys_file=lines).key_ring
    assert ring.caller("sk-a") == Caller("alice", False) and ring.caller("sk-o") == Caller("ops", True)
    assert ring.caller("sk-root") == Caller("admin", True) and ring.caller("sk-x") is None
    assert "sk-a" not in repr(ApiKey("sk-a", "user", "alice"))  # configs end up in logs
    with pytest.raises(ValueError, match="api_keys_file: cannot read"):
        ServeConfig(api_keys_file=tmp_path / "missing.txt")


@pytest.mark.parametrize(("text", "message"), [
    ("sk-a user\n", r"keys.txt:1: expected 'KEY ROLE OWNER', got 2 words"),
    ("# x\nsk-a root alice\n", r"keys.txt:2: api_keys: role must be one of admin, user, got 'root'"),
    ("sk-a user ali/ce\n", r"keys.txt:1: api_keys: owner 'ali/ce' must be 1 to 64"),
    ('[{"key": "sk-a", "role": "user", "owner": "a", "scopes": 1}]', r"entry 0: expected"),
    ('[{"key": 5, "role": "user", "owner": "a"}]', r"entry 0: api_keys: a key must be a non-empty ASCII string"),
    ("[", r"is not valid JSON"),
    ("sk-a user alice\nsk-a admin ops\n", r"listed twice"),
])
def test_a_bad_keys_file_stops_the_start_naming_the_line(tmp_path: Path, text: str, message: str):
    path = tmp_path / "keys.txt"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        ServeConfig(api_keys_file=path)


def test_the_guard_leaves_the_callers_owner_and_role_for_the_routes():
    keys = (ApiKey("sk-a", "user", "alice"), ApiKey("sk-o", "admin", "ops"))
    guard = RequestGuard(None, ServeConfig(api_keys=keys))  # type: ignore[arg-type]
    assert guard._caller(_scope("sk-a")) == Caller("alice", False)
    assert guard._caller(_scope("sk-o")) == Caller("ops", True)
    assert guard.refusal(_scope("sk-x"))[0] == 401 and guard.refusal(_scope(None))[0] == 401
    assert guard.websocket_caller({**_scope(None), "query_string": b"api_key=sk-a"}) == Caller("alice", False)
    assert RequestGuard(None, ServeConfig())._caller(_scope(None)) == OPEN  # type: ignore[arg-type]
    assert not ANONYMOUS.sees(None) and not Caller("alice", False).sees(None) and OPEN.sees("alice")
    assert not KeyRing(())
