"""A world-model job's predicted actions: written beside its mp4, served as content variants.

`GET /v1/videos/{id}/content?variant=actions` answers JSON ({"shape": [T, D], "actions": [[...], ...]} plus the
block's mode and domain), `variant=actions_npy` the float32 .npy file itself (numpy.load reads it). A job
without predicted actions (another model, or forward_dynamics, which takes them) answers 404 for both.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
from fastapi.responses import JSONResponse, Response

from vidloom.media.atomic import atomic_path
from vidloom.serving.errors import APIError

ACTION_VARIANTS = ("actions", "actions_npy")


def save_actions(path: Path, actions: np.ndarray) -> None:
    """Write [T, D] float32 atomically (before the job turns completed, like its mp4)."""
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as file:
            np.save(file, np.ascontiguousarray(actions, dtype=np.float32), allow_pickle=False)


def actions_response(path: Path, variant: str, video_id: str, metadata: dict[str, Any] | None) -> Response:
    """The stored actions as JSON or .npy; 404 naming the variant when the job predicted none."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise APIError(404, f"variant: video {video_id} has no predicted actions (only policy and "
                            "inverse_dynamics action runs predict them)", param="variant",
                       code="actions_not_found") from None
    if variant == "actions_npy":
        headers = {"Content-Disposition": f'attachment; filename="{video_id}_actions.npy"'}
        return Response(data, media_type="application/octet-stream", headers=headers)
    actions = np.load(io.BytesIO(data), allow_pickle=False)
    block = dict((metadata or {}).get("action") or {})
    return JSONResponse({"id": video_id, **block, "shape": list(actions.shape), "actions": actions.tolist()})
