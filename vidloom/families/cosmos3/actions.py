"""Cosmos3's action block: embodiment tables, boundary validation of an ActionInput, the action caption.

The domain ids, widths, viewpoint sentences and conditioning canvases are data the checkpoint was trained
with (diffusers' Cosmos3OmniPipeline carries the same tables, from the Cosmos 3 unified action
representation); `resolve_action` checks a request's block against them and against the checkpoint's
action pathway (padded width, number of domains) before anything is queued.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from vidloom.core.action import ACTION_MODES, ActionInput
from vidloom.core.errors import InvalidRequest
from vidloom.core.request_checks import shown

# Embodiment -> the domain id selecting its action projections.
DOMAIN_IDS = {
    "no_action": 0, "av": 1, "camera_pose": 2, "hand_pose": 3, "pusht": 4, "libero": 5, "umi": 6,
    "bridge_orig_lerobot": 7, "droid_lerobot": 8, "robomind-franka": 8, "galbot": 9, "robomind-franka-dual": 12,
    "robomind-ur": 13, "agibotworld": 15, "agibot_gear_gripper": 15, "agibot_gear_gripper_ext": 15, "fractal": 20,
}
# Embodiment -> its unpadded action width: sums of 9D poses (translation + 6D rotation), 1D grippers and 15D
# fingertip sets. `no_action` and `libero` (whose width depends on the dataset) have none: no action runs.
RAW_WIDTHS = {
    "av": 9, "camera_pose": 9, "pusht": 2, "umi": 10, "bridge_orig_lerobot": 10, "droid_lerobot": 10,
    "robomind-franka": 10, "robomind-franka-dual": 20, "robomind-ur": 10, "galbot": 30, "agibotworld": 29,
    "agibot_gear_gripper": 29, "agibot_gear_gripper_ext": 29, "fractal": 10, "hand_pose": 57,
}
VIEWPOINTS = {
    "ego_view": "This video is captured from a first-person perspective looking at the scene.",
    "third_person_view": "This video is captured from a third-person perspective looking towards the agent from "
                         "the front.",
    "wrist_view": "This video is captured from a wrist-mounted camera.",
    "concat_view": "This video contains concatenated views from multiple camera perspectives.",
}
# Resolution tier -> {height/width ratio: (canvas height, canvas width)}.
CANVASES: dict[int, dict[float, tuple[int, int]]] = {
    256: {1.0: (256, 256), 0.8: (256, 320), 1.25: (320, 256), 0.6: (192, 320), 1 / 0.6: (320, 192)},
    480: {1.0: (640, 640), 544 / 736: (544, 736), 736 / 544: (736, 544), 480 / 832: (480, 832),
          832 / 480: (832, 480)},
    704: {1.0: (960, 960), 832 / 1088: (832, 1088), 1088 / 832: (1088, 832), 0.55: (704, 1280),
          1280 / 704: (1280, 704)},
    720: {1.0: (960, 960), 832 / 1104: (832, 1104), 1104 / 832: (1104, 832), 0.5625: (720, 1280),
          1280 / 720: (1280, 720)},
}
MAX_CHUNK = 256  # action steps per request: the released models use chunks of 16-32
ASPECTS = ("1,1", "4,3", "3,4", "16,9", "9,16")


@dataclass(frozen=True)
class ResolvedAction:
    """A checked action block, with its conditioning media (not decoded yet) and the canvas it goes into."""

    mode: str
    domain_name: str
    domain_id: int
    raw_width: int
    chunk_size: int
    view_point: str
    raw_actions: np.ndarray | None  # forward_dynamics: [chunk_size, raw_width] float32
    media: tuple[Any, ...]  # conditioning frames (PIL images or EncodedImage), or an EncodedVideo in a 1-tuple
    source_size: tuple[int, int]  # (height, width) of the frames, floored to the VAE's 16
    canvas: tuple[int, int]  # (height, width) the frames are padded into
    content: tuple[int, int]  # (height, width) of the frames inside the canvas
    session_id: str | None = None  # an action session's chunk: its prefix K/V may stay resident under this id

    @property
    def num_frames(self) -> int:
        return self.chunk_size + 1

    @property
    def predicts_actions(self) -> bool:
        return self.mode != "forward_dynamics"

    def params(self) -> dict[str, Any]:
        """The block as a job stores it (JSON: no media, the given actions as lists)."""
        return {"mode": self.mode, "domain_name": self.domain_name, "chunk_size": self.chunk_size,
                "view_point": self.view_point, "canvas": list(self.canvas),
                "raw_actions": None if self.raw_actions is None else self.raw_actions.tolist()}


def canvas_for(height: int, width: int, tier: int) -> tuple[int, int]:
    """The tier's canvas whose height/width ratio is closest to the frames' (the first on a tie)."""
    ratios = CANVASES[tier]
    return ratios[min(ratios, key=lambda r: abs(r - height / width))]


def content_size(height: int, width: int, canvas: tuple[int, int]) -> tuple[int, int]:
    """The frames' size inside the canvas: downscaled to fit, never upscaled (rounded half up)."""
    scale = min(canvas[1] / width, canvas[0] / height, 1.0)
    return max(1, int(scale * height + 0.5)), max(1, int(scale * width + 0.5))


def resolve_action(request: Any, card: Any) -> dict[str, Any]:
    """The action block's resolver (ModelCard.request_blocks["action"]): the request fields it sets (the block
    resolved, the frame count and output size); InvalidRequest naming `action.<field>` (or image / video) for
    anything the model cannot run."""
    limits, spatial = card.request_blocks["action"].limits, card.geometry.spatial_multiple
    block = request.option("action")
    if isinstance(block, ResolvedAction):  # resolved already (the server plans, then the engine resolves)
        return {}
    if not isinstance(block, ActionInput):
        raise InvalidRequest("action", f"must be an ActionInput, got {type(block).__name__}")
    if not isinstance(block.mode, str) or block.mode not in ACTION_MODES:  # a list is unhashable: no `in`
        raise InvalidRequest("action.mode", f"unknown mode {shown(block.mode)}; known: {', '.join(ACTION_MODES)}")
    domain = _domain(block.domain_name, limits)
    chunk = block.chunk_size
    if isinstance(chunk, bool) or not isinstance(chunk, int) or not 1 <= chunk <= MAX_CHUNK:
        raise InvalidRequest("action.chunk_size", f"must be an integer in 1..{MAX_CHUNK}, got {shown(chunk)}")
    if chunk % 4:
        raise InvalidRequest("action.chunk_size", f"{chunk} steps make {chunk + 1} frames; the VAE needs 4k+1 "
                                                  "frames, so chunk_size must be a multiple of 4")
    if not isinstance(block.view_point, str) or block.view_point not in VIEWPOINTS:
        raise InvalidRequest("action.view_point", f"unknown view point {shown(block.view_point)}; "
                                                  f"known: {', '.join(VIEWPOINTS)}")
    tier = block.resolution_tier
    if isinstance(tier, bool) or not isinstance(tier, int) or tier not in CANVASES:
        raise InvalidRequest("action.resolution_tier", f"must be one of {sorted(CANVASES)}, got {shown(tier)}")
    for name in ("num_frames", "height", "width", "last_image"):
        if getattr(request, name) is not None:
            raise InvalidRequest(name, "is set by the action block (chunk_size + 1 frames, the input's size)")
    if request.option("reason") or request.option("sound"):
        raise InvalidRequest("reason" if request.option("reason") else "sound", "does not combine with an action block")
    raw_width = RAW_WIDTHS[block.domain_name]
    raw = _raw_actions(block, raw_width)
    media, (src_h, src_w) = _media(request, block.mode)
    source = (src_h // spatial * spatial, src_w // spatial * spatial)
    if min(source) < spatial:
        field = "video" if request.video is not None else "image"
        raise InvalidRequest(field, f"is {src_w}x{src_h}; both sides must be at least {spatial} px")
    canvas = canvas_for(*source, block.resolution_tier)
    content = content_size(*source, canvas)
    out_h, out_w = (max(side // spatial, 1) * spatial for side in content)
    resolved = ResolvedAction(
        mode=block.mode, domain_name=block.domain_name, domain_id=domain, raw_width=raw_width, chunk_size=chunk,
        view_point=block.view_point, raw_actions=raw, media=media, source_size=source, canvas=canvas,
        content=content)
    return {"action": resolved, "image": None, "video": None, "num_frames": chunk + 1, "height": out_h,
            "width": out_w}


def _domain(name: Any, limits: Mapping[str, int]) -> int:
    if not isinstance(name, str) or name not in RAW_WIDTHS:
        known = ", ".join(sorted(d for d in RAW_WIDTHS if RAW_WIDTHS[d] <= limits["action_dim"]
                                 and DOMAIN_IDS[d] < limits["domains"]))
        why = " (it has no fixed action width)" if isinstance(name, str) and name in DOMAIN_IDS else ""
        raise InvalidRequest("action.domain_name", f"unknown embodiment {shown(name)}{why}; known: {known}")
    if RAW_WIDTHS[name] > limits["action_dim"]:
        raise InvalidRequest("action.domain_name", f"{name!r} actions are {RAW_WIDTHS[name]} wide; this checkpoint's "
                                                   f"action pathway holds {limits['action_dim']}")
    if DOMAIN_IDS[name] >= limits["domains"]:
        raise InvalidRequest("action.domain_name", f"{name!r} is domain {DOMAIN_IDS[name]}; this checkpoint has "
                                                   f"weights for domains 0..{limits['domains'] - 1}")
    return DOMAIN_IDS[name]


def _raw_actions(block: ActionInput, width: int) -> np.ndarray | None:
    """forward_dynamics' actions as float32 [chunk_size, width]: short ones repeat the last, long ones are cut."""
    if block.mode != "forward_dynamics":
        if block.raw_actions is not None:
            raise InvalidRequest("action.raw_actions", f"mode {block.mode} predicts the actions; give none")
        return None
    if block.raw_actions is None:
        raise InvalidRequest("action.raw_actions", "forward_dynamics needs the actions to roll out ([T, D] numbers)")
    value = block.raw_actions
    if hasattr(value, "detach"):  # a torch tensor
        value = value.detach().cpu().float().numpy()
    try:
        array = np.asarray(value, dtype=np.float32)
    except (TypeError, ValueError):
        raise InvalidRequest("action.raw_actions", "must be a [T, D] array of numbers") from None
    if array.ndim != 2 or array.shape[0] < 1:
        raise InvalidRequest("action.raw_actions", f"must have shape [T, D] with T >= 1, got {list(array.shape)}")
    if array.shape[1] != width:
        raise InvalidRequest("action.raw_actions", f"is {array.shape[1]} wide; {block.domain_name!r} actions are "
                                                   f"{width} wide")
    if not np.isfinite(array).all():
        raise InvalidRequest("action.raw_actions", "must be finite numbers (no NaN or inf)")
    if array.shape[0] < block.chunk_size:
        array = np.concatenate([array, np.repeat(array[-1:], block.chunk_size - array.shape[0], axis=0)])
    return np.ascontiguousarray(array[: block.chunk_size])


def _media(request: Any, mode: str) -> tuple[tuple[Any, ...], tuple[int, int]]:
    """The conditioning frames (opened, not decoded) and their (height, width)."""
    from vidloom.media.image import open_images
    from vidloom.media.uploads import open_video

    if request.image is not None and request.video is not None:
        raise InvalidRequest("video", "an action run takes either image (the first frame) or video, not both")
    if mode == "inverse_dynamics" and request.video is None:
        raise InvalidRequest("video", "inverse_dynamics infers the actions between the frames of a video; give video")
    if request.video is None and request.image is None:
        raise InvalidRequest("image", f"{mode} rolls out from a first frame; give image (or video)")
    if request.image is not None:
        images = open_images(request.image, "image")
        if len(images) != 1:
            raise InvalidRequest("image", f"an action run takes one first frame, got {len(images)}")
        width, height = images[0].size
        return images, (height, width)
    video = open_video(request.video, "video")
    frames = (video,) if not isinstance(video, list) else tuple(video)
    width, height = video.size if not isinstance(video, list) else video[0].size
    return frames, (height, width)


def action_caption(description: str, action: ResolvedAction, fps: float) -> str:
    """The structured JSON caption the action model was trained on (framing, action span, duration, size)."""
    seconds = action.num_frames / fps
    span = round(seconds) if math.isfinite(seconds) else 0
    minutes, rest = divmod(span, 60)
    text = description.strip()
    if text and not text.endswith((".", "!", "?")):
        text += "."
    height, width = action.canvas
    ratio = width / height
    caption = {
        "cinematography": {"framing": VIEWPOINTS[action.view_point]},
        "actions": [{"time": f"0:00-{minutes}:{rest:02d}", "description": text}],
        "duration": f"{int(seconds)}s",
        "fps": float(fps),
        "resolution": {"H": height, "W": width},
        "aspect_ratio": min(ASPECTS, key=lambda a: abs(int(a.split(",")[0]) / int(a.split(",")[1]) - ratio)),
    }
    return json.dumps(caption)
