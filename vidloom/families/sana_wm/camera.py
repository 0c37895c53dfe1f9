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
# Poses one camera may describe (an action string's frames, c2w's rows): ten times a minute-long clip at the
# card's 16 fps. An action string is counted segment by segment before it expands to one pose per frame.
MAX_CAMERA_FRAMES = 10_000
MAX_TRANSLATION = 1e4  # world units a c2w pose may sit from the origin (the action language moves 0.05 a frame)
MAX_FOCAL_PIXELS = 1e6  # fx, fy, cx, cy bound, in pixels: past it the rays' float32 maths loses every digit
ROTATION_TOLERANCE = 1e-3  # how far a c2w rotation block may be from orthonormal (float32 round trips stay within)


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
            count = 1 + sum(frames for _, frames in _segments(action))  # fails early, naming the segment
        else:
            poses = _check_poses(_float_array("c2w", c2w))
            count = poses.shape[0]
        if intrinsics is None:
            raise InvalidRequest("intrinsics", "required with a camera: [fx, fy, cx, cy] in first-frame pixels")
        intr = _float_array("intrinsics", intrinsics)
        if intr.shape not in ((4,), (3, 3)) and not (intr.ndim == 2 and intr.shape[1] == 4) \
                and not (intr.ndim == 3 and intr.shape[1:] == (3, 3)):
            raise InvalidRequest("intrinsics", f"must be [4], [3, 3], [F, 4] or [F, 3, 3], got {list(intr.shape)}")
        vec = _as_vec4(intr)
        if not np.all(vec[..., :2] > 0):
            raise InvalidRequest("intrinsics", "focal lengths fx, fy must be positive")
        if not np.all(np.abs(vec) <= MAX_FOCAL_PIXELS):
            raise InvalidRequest("intrinsics", f"must lie within +-{MAX_FOCAL_PIXELS:g} pixels (MAX_FOCAL_PIXELS)")
        if vec.ndim == 2 and vec.shape[0] != count:
            raise InvalidRequest("intrinsics", f"per-frame intrinsics give {vec.shape[0]} rows; the camera has "
                                               f"{count} poses (one row per pose, or one [4] / [3, 3] for all)")
        return cls(action=action, c2w=poses, intrinsics=intr)

    def poses(self) -> np.ndarray:
        return parse_action(self.action) if self.action is not None else self.c2w


def _float_array(field: str, value) -> np.ndarray:
    _check_size(field, value)
    try:
        arr = np.asarray(value, dtype=np.float32)
    except (TypeError, ValueError):
        raise InvalidRequest(field, "must be a nested list of numbers of one shape") from None
    except OverflowError:  # an integer past float's range (a 400-digit number)
        raise InvalidRequest(field, "must be finite numbers") from None
    if not np.all(np.isfinite(arr)):
        raise InvalidRequest(field, "must be finite numbers")
    return arr


def _check_size(field: str, value) -> None:
    """At most MAX_CAMERA_FRAMES rows before numpy converts them (numpy refuses ragged or too-deep nesting itself)."""
    if isinstance(value, (list, tuple)) and len(value) > MAX_CAMERA_FRAMES:
        raise InvalidRequest(field, f"has {len(value)} rows, more than {MAX_CAMERA_FRAMES} (MAX_CAMERA_FRAMES)")


def _check_poses(poses: np.ndarray) -> np.ndarray:
    """[F, 4, 4] rigid camera-to-world poses: a rotation, a translation within MAX_TRANSLATION, [0, 0, 0, 1] below."""
    if poses.ndim != 3 or poses.shape[1:] != (4, 4) or poses.shape[0] < 1:
        raise InvalidRequest("c2w", f"must be [F, 4, 4] camera-to-world poses, got shape {list(poses.shape)}")
    if poses.shape[0] > MAX_CAMERA_FRAMES:
        raise InvalidRequest("c2w", f"has {poses.shape[0]} poses, more than {MAX_CAMERA_FRAMES} (MAX_CAMERA_FRAMES)")
    poses64 = poses.astype(np.float64)
    if not np.all(np.abs(poses64[:, :3, 3]) <= MAX_TRANSLATION):
        raise InvalidRequest("c2w", f"translations must lie within +-{MAX_TRANSLATION:g} (MAX_TRANSLATION)")
    if np.abs(poses64[:, 3] - [0.0, 0.0, 0.0, 1.0]).max() > ROTATION_TOLERANCE:
        raise InvalidRequest("c2w", "each pose's last row must be [0, 0, 0, 1]")
    rotations = poses64[:, :3, :3]
    drift = np.abs(rotations @ rotations.transpose(0, 2, 1) - np.eye(3)).max()
    if drift > ROTATION_TOLERANCE or np.any(np.linalg.det(rotations) <= 0):
        raise InvalidRequest("c2w", "each pose's upper-left 3x3 must be a rotation (orthonormal, determinant +1)")
    return poses


def _as_vec4(intr: np.ndarray) -> np.ndarray:
    if intr.shape[-2:] == (3, 3):
        return np.stack([intr[..., 0, 0], intr[..., 1, 1], intr[..., 0, 2], intr[..., 1, 2]], axis=-1)
    return intr


def _segments(action: str) -> list[tuple[frozenset[str], int]]:
    """(held keys, frames) per segment, their total within MAX_CAMERA_FRAMES; InvalidRequest('camera') names a
    malformed segment. Nothing expands here: a request's camera is checked in time linear in its length."""
    cleaned = "".join(action.replace("\uff0c", ",").split())
    if not cleaned:
        raise InvalidRequest("camera", "the action string is empty")
    out: list[tuple[frozenset[str], int]] = []
    total = 0
    for segment in cleaned.split(","):
        keys, sep, count = segment.rpartition("-")
        shown = segment if len(segment) <= 40 else f"{segment[:40]}..."
        if not sep or not segment:
            raise InvalidRequest("camera", f"segment {shown!r} must be '<keys>-<frames>', e.g. 'w-80'")
        if not (count.isascii() and count.isdigit()):  # ASCII digits only: "²".isdigit() holds, int() refuses it
            raise InvalidRequest("camera", f"segment {shown!r} needs a positive frame count")
        digits = count.lstrip("0")  # int() reads no more digits than the cap has (5,000 nines would raise)
        frames = int(digits or "0") if len(digits) <= _CAP_DIGITS else MAX_CAMERA_FRAMES + 1
        if frames <= 0:
            raise InvalidRequest("camera", f"segment {shown!r} needs a positive frame count")
        keys = keys.lower()
        held = frozenset() if keys == "none" else frozenset(keys)
        unknown = sorted(held - ACTION_KEYS)
        if unknown:
            raise InvalidRequest("camera", f"segment {shown!r} has unknown keys {unknown}; use w a s d i j k l "
                                 "or 'none'")
        total += frames
        if total > MAX_CAMERA_FRAMES:
            raise InvalidRequest("camera", f"the action string spans more than {MAX_CAMERA_FRAMES} frames "
                                           "(MAX_CAMERA_FRAMES)")
        out.append((held, frames))
    return out


_CAP_DIGITS = len(str(MAX_CAMERA_FRAMES))


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
    for held in (keys for keys, frames in _segments(action) for _ in range(frames)):
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


def check_size(request, card) -> None:
    """The camera block's check (every SANA-WM request has a camera): the LTX-2 VAE's reflect-padded decoder
    needs two latent cells a side, so a smaller size is refused here, not by the job after it queued."""
    least = 2 * card.geometry.spatial_multiple
    for name in ("height", "width"):
        value = getattr(request, name)
        if isinstance(value, int) and value < least:
            raise InvalidRequest(name, f"{value} px is below {least}, the least this model's VAE decodes "
                                       "(two latent cells)")
