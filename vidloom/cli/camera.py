"""`vidloom generate` camera flags (camera-controlled world models: SANA-WM) -> the request's fields.

--camera takes the action string itself; --c2w a .npy or .json file of [F, 4, 4] poses; --intrinsics
"fx,fy,cx,cy" or a .npy / .json file (a 3x3 K or per-frame values). A file that cannot be read is an
InvalidRequest naming the field; shapes and values are checked with the request (recipes' CameraInput).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from vidloom.core.errors import InvalidRequest


def camera_fields(camera: str | None, c2w: str | None, intrinsics: str | None) -> dict[str, Any]:
    """Only the flags given, so cards without a camera never see the fields."""
    fields: dict[str, Any] = {}
    if camera is not None:
        fields["camera"] = camera
    if c2w is not None:
        fields["c2w"] = _array_file("c2w", c2w)
    if intrinsics is not None:
        fields["intrinsics"] = _intrinsics(intrinsics)
    return fields


def _intrinsics(value: str) -> Any:
    if Path(value).suffix.lower() in (".npy", ".json"):
        return _array_file("intrinsics", value)
    try:
        return [float(v) for v in value.split(",")]
    except ValueError:
        raise InvalidRequest("intrinsics", f"expected 'fx,fy,cx,cy' or a .npy/.json file, got {value!r}") from None


def _array_file(field: str, path: str) -> Any:
    file = Path(path).expanduser()
    if not file.is_file():
        raise InvalidRequest(field, f"no such file: {path}")
    try:
        if file.suffix.lower() == ".npy":
            return np.load(file, allow_pickle=False)
        if file.suffix.lower() == ".json":
            return json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise InvalidRequest(field, f"cannot read {path}: {exc}") from None
    raise InvalidRequest(field, f"{path}: expected a .npy or .json file")
