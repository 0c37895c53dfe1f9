"""SANA-WM camera input: a WASD/IJKL action string or explicit c2w poses, plus pinhole intrinsics.

Validated at the boundary (InvalidRequest naming `camera`, `c2w` or `intrinsics`) and turned into what
the DiT reads: per-latent-frame raymaps (first-frame-relative pose + latent intrinsics) and chunked
Plucker rays. The action language, its motion constants and the packing match diffusers' SanaWM
`cam_utils` (the model was trained on trajectories made that way).

Action strings: comma-separated `<keys>-<frames>` segments, e.g. "w-80,jw-40". Keys held for that many
frames: w/s forward/back, a/d left/right (on the ground plane), i/k pitch up/down, j/l yaw left/right;
"none-20" holds still. OpenCV axes: +x right, +y down, +z forward.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from vidloom.core.errors import InvalidRequest

ACTION_KEYS = frozenset("wasdijkl")
TRANSLATION_PER_FRAME = 0.05  # world units per frame a translation key is held (SANA-WM cam_utils)
ROTATION_PER_FRAME_DEG = 1.2
PITCH_LIMIT_DEG = 85.0
MAX_ACTION_FRAMES = 100_000  # an action string expands to one pose per frame; this bounds the allocation


@dataclass(frozen=True)
class CameraInput:
    """The camera block of a SANA-WM request: exactly one of `action` / `c2w`, and `intrinsics`.

    `intrinsics` is [fx, fy, cx, cy], a 3x3 K, per-frame [F, 4] or [F, 3, 3], in pixels of the
    original first-frame image (the pipeline rescales them for its resize + centre crop).
    """

    action: str | None = None
    c2w: np.ndarray | None = None  # [F, 4, 4] camera-to-world poses
    intrinsics: np.ndarray | None = None

    @classmethod
    def build(cls, action: str | None = None, c2w=None, intrinsics=None) -> CameraInput:
        """Validate raw user values (lists, arrays, strings); raises InvalidRequest naming the field."""
        if (action is None) == (c2w is None):
            raise InvalidRequest("camera", "give exactly one of an action string (camera) or explicit poses (c2w)")
        poses = None
        if action is not None:
            if not isinstance(action, str):
                raise InvalidRequest("camera", f"must be an action string such as 'w-80,jw-40', got {type(action).__name__}")
            parse_action(action)  # fails early, naming the segment
        else:
            poses = _float_array("c2w", c2w)
            if poses.ndim != 3 or poses.shape[1:] != (4, 4) or poses.shape[0] < 1:
                raise InvalidRequest("c2w", f"must be [F, 4, 4] camera-to-world poses, got shape {list(poses.shape)}")
        if intrinsics is None:
            raise InvalidRequest("intrinsics", "required with a camera: [fx, fy, cx, cy] in first-frame pixels")
        intr = _float_array("intrinsics", intrinsics)
        if intr.shape not in ((4,), (3, 3)) and not (intr.ndim == 2 and intr.shape[1] == 4) \
                and not (intr.ndim == 3 and intr.shape[1:] == (3, 3)):
            raise InvalidRequest("intrinsics", f"must be [4], [3, 3], [F, 4] or [F, 3, 3], got {list(intr.shape)}")
        vec = _as_vec4(intr)
        if not np.all(vec[..., :2] > 0):
            raise InvalidRequest("intrinsics", "focal lengths fx, fy must be positive")
        return cls(action=action, c2w=poses, intrinsics=intr)

    def poses(self) -> np.ndarray:
        return parse_action(self.action) if self.action is not None else self.c2w


def _float_array(field: str, value) -> np.ndarray:
    try:
        arr = np.asarray(value, dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(field, f"must be numbers ({exc})") from None
    if not np.all(np.isfinite(arr)):
        raise InvalidRequest(field, "must be finite numbers")
    return arr


def _as_vec4(intr: np.ndarray) -> np.ndarray:
    if intr.shape[-2:] == (3, 3):
        return np.stack([intr[..., 0, 0], intr[..., 1, 1], intr[..., 0, 2], intr[..., 1, 2]], axis=-1)
    return intr


def _held_keys(action: str) -> list[frozenset[str]]:
    """One set of held keys per frame; InvalidRequest('camera') names a malformed segment."""
    cleaned = "".join(action.replace("\uff0c", ",").split())
    if not cleaned:
        raise InvalidRequest("camera", "the action string is empty")
    frames: list[frozenset[str]] = []
    for segment in cleaned.split(","):
        keys, sep, count = segment.rpartition("-")
        if not sep or not segment:
            raise InvalidRequest("camera", f"segment {segment!r} must be '<keys>-<frames>', e.g. 'w-80'")
        if not count.isdigit() or int(count) <= 0:
            raise InvalidRequest("camera", f"segment {segment!r} needs a positive frame count, got {count!r}")
        keys = keys.lower()
        held = frozenset() if keys == "none" else frozenset(keys)
        unknown = sorted(held - ACTION_KEYS)
        if unknown:
            raise InvalidRequest("camera", f"segment {segment!r} has unknown keys {unknown}; use w a s d i j k l "
                                 "or 'none'")
        if len(frames) + int(count) > MAX_ACTION_FRAMES:
            raise InvalidRequest("camera", f"the action string spans more than {MAX_ACTION_FRAMES} frames")
        frames.extend([held] * int(count))
    return frames


def _rot_x(a: float) -> np.ndarray:
    c, s = math.cos(a), math.sin(a)
    return np.array([[1.0, 0.0, 0.0], [0.0, c, -s], [0.0, s, c]])


def _rot_y(a: float) -> np.ndarray:
    c, s = math.cos(a), math.sin(a)
    return np.array([[c, 0.0, s], [0.0, 1.0, 0.0], [-s, 0.0, c]])


def _ground_unit(v: np.ndarray) -> np.ndarray:
    v = v.copy()
    v[1] = 0.0
    n = float(np.linalg.norm(v))
    return v / n if n > 0 else v


def parse_action(action: str) -> np.ndarray:
    """Action string -> [frames + 1, 4, 4] float32 c2w poses starting at the identity.

    Pitch (i/k) is applied in the camera frame and clamped at +-85 degrees; yaw (j/l) about the world
    y axis; translations move on the ground plane along the camera's heading.
    """
    step = math.radians(ROTATION_PER_FRAME_DEG)
    limit = math.radians(PITCH_LIMIT_DEG)
    pose, pitch = np.eye(4), 0.0
    poses = [pose.copy()]
    for held in _held_keys(action):
        d_pitch = (step if "i" in held else 0.0) - (step if "k" in held else 0.0)
        if -limit <= pitch + d_pitch <= limit:
            pitch += d_pitch
        else:
            d_pitch = 0.0
        d_yaw = (step if "l" in held else 0.0) - (step if "j" in held else 0.0)
        rotation = _rot_y(d_yaw) @ pose[:3, :3] @ _rot_x(d_pitch)
        forward, right = _ground_unit(rotation[:, 2]), _ground_unit(rotation[:, 0])
        move = np.zeros(3)
        for key, direction in (("w", forward), ("s", -forward), ("d", right), ("a", -right)):
            if key in held:
                move += direction * TRANSLATION_PER_FRAME
        nxt = np.eye(4)
        nxt[:3, :3] = rotation
        nxt[:3, 3] = pose[:3, 3] + move
        pose = nxt
        poses.append(pose.copy())
    return np.stack(poses).astype(np.float32)


def resolve_camera(request, card) -> dict:
    """The camera block's resolver (ModelCard.request_blocks["camera"]): the request's camera fields -> a
    validated CameraInput in `camera` (the raw c2w / intrinsics stay, so resolving again is a no-op)."""
    if isinstance(request.option("camera"), CameraInput):
        return {}
    return {"camera": CameraInput.build(action=request.option("camera"), c2w=request.option("c2w"), intrinsics=request.option("intrinsics"))}
