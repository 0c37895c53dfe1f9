"""API keys with roles and owners: who is calling, what they may do, and whose jobs and sessions they see.

As the OpenAI API scopes jobs to a project, every job and session belongs to the owner of the key that created
it; a key sees, streams, cancels and deletes only its owner's (another owner's id answers 404, like a missing
one). An `admin` key also loads and unloads LoRA adapters and sees every owner's jobs. Keys come from the
deployment card (`api_keys`), a keys file (`--api-keys-file`) and the single `--api-key` (an admin).
"""

from __future__ import annotations

import hmac
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

API_KEY_ENV = "VIDLOOM_API_KEY"  # the API key from the environment keeps it out of `ps` listings
ROLES = ("admin", "user")
SINGLE_KEY_OWNER = "admin"
"""The owner of the single --api-key (an admin key: it sees every job anyway)."""
MAX_OWNER_CHARS = 64
_OWNER = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]*")
CALLER_SCOPE_KEY = "vidloom.caller"
"""Where RequestGuard leaves the Caller in an ASGI scope (HTTP and WebSocket) for the routes."""


@dataclass(frozen=True)
class ApiKey:
    """One key: its secret, its role (admin | user) and the owner its jobs and sessions belong to."""

    key: str
    role: str = "user"
    owner: str = "default"

    def __post_init__(self) -> None:
        if not isinstance(self.key, str) or not self.key.strip() or not self.key.isascii():
            raise ValueError("api_keys: a key must be a non-empty ASCII string")
        if self.role not in ROLES:
            raise ValueError(f"api_keys: role must be one of {', '.join(ROLES)}, got {str(self.role)[:20]!r}")
        if (not isinstance(self.owner, str) or len(self.owner) > MAX_OWNER_CHARS
                or not _OWNER.fullmatch(self.owner)):
            raise ValueError(f"api_keys: owner {str(self.owner)[:40]!r} must be 1 to {MAX_OWNER_CHARS} letters, "
                             "digits, '.', '_', '@' or '-'")

    def __repr__(self) -> str:  # never the secret: configs end up in logs and tracebacks
        return f"ApiKey(role={self.role!r}, owner={self.owner!r})"


@dataclass(frozen=True)
class Caller:
    """Who a request comes from: the owner its jobs belong to (None: a server without keys) and its rights."""

    owner: str | None
    admin: bool

    def sees(self, owner: str | None) -> bool:
        """May this caller see (stream, cancel, delete) a job or session of `owner`?"""
        return self.admin or (self.owner is not None and owner == self.owner)


OPEN = Caller(owner=None, admin=True)
"""A server without keys: every caller may do everything (as before keys had roles)."""
ANONYMOUS = Caller(owner=None, admin=False)
"""No key on an open path (/health, /metrics, the playground's files): sees nothing."""


def caller_of(scope: Mapping[str, Any]) -> Caller:
    """The caller RequestGuard found for this request; OPEN where no guard runs (a fleet replica's app: its
    ingress checked the key)."""
    return scope.get(CALLER_SCOPE_KEY, OPEN)


class KeyRing:
    """The keys of one server, matched in constant time (every key is compared, whichever matches)."""

    def __init__(self, keys: Iterable[ApiKey]) -> None:
        self._keys = [(k.key.encode(), Caller(k.owner, k.role == "admin")) for k in keys]

    def __bool__(self) -> bool:
        return bool(self._keys)

    def caller(self, token: str) -> Caller | None:
        """The caller `token` belongs to; None for no key of ours."""
        sent = token.encode("utf-8", "surrogateescape")
        found = None
        for secret, caller in self._keys:
            # Constant time, and no early exit: timing tells neither how much of a key was right nor which key.
            if hmac.compare_digest(sent, secret) and found is None:
                found = caller
        return found


def read_keys_file(path: Path) -> tuple[ApiKey, ...]:
    """The keys in `path`: a JSON list of {"key", "role", "owner"} objects, or lines `KEY ROLE OWNER` (`#`
    comments and blank lines ignored). ValueError naming the file and the line or entry."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"api_keys_file: cannot read {path} ({exc.__class__.__name__})") from None
    if text.lstrip().startswith("["):
        return _json_keys(path, text)
    keys = []
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        if len(words) != 3:
            raise ValueError(f"api_keys_file: {path}:{number}: expected 'KEY ROLE OWNER', got {len(words)} words")
        try:
            keys.append(ApiKey(*words))
        except ValueError as exc:
            raise ValueError(f"api_keys_file: {path}:{number}: {exc}") from None
    return tuple(keys)


def _json_keys(path: Path, text: str) -> tuple[ApiKey, ...]:
    try:
        entries = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"api_keys_file: {path} is not valid JSON ({exc.__class__.__name__})") from None
    keys = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict) or set(entry) - {"key", "role", "owner"} or "key" not in entry:
            raise ValueError(f"api_keys_file: {path} entry {index}: expected {{\"key\", \"role\", \"owner\"}}")
        try:
            keys.append(ApiKey(**entry))
        except ValueError as exc:
            raise ValueError(f"api_keys_file: {path} entry {index}: {exc}") from None
    return tuple(keys)


def check_unique(keys: Iterable[ApiKey]) -> None:
    """ValueError when one secret is listed twice (it would belong to two owners)."""
    seen: set[str] = set()
    for key in keys:
        if key.key in seen:
            raise ValueError(f"api_keys: a key of owner {key.owner!r} is listed twice")
        seen.add(key.key)
