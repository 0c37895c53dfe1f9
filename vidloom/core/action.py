"""ActionInput: the typed request block of world models driven by actions (Cosmos3's action pathway).

A card that reads it declares a resolver for it (`ModelCard.request_blocks["action"]`, a "module:function"
string); `resolve_request` calls that resolver at the boundary, so each family checks its own domains,
widths and mode rules, and a card without one refuses the block by name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ACTION_MODES = ("forward_dynamics", "inverse_dynamics", "policy")
"""forward_dynamics: first frame + raw actions -> video; policy: first frame -> video + actions;
inverse_dynamics: video -> the actions connecting its frames."""


@dataclass(frozen=True)
class ActionInput:
    """An action-conditioned generation: what to roll out or infer, for which embodiment.

    mode: one of ACTION_MODES.
    domain_name: the embodiment (e.g. "bridge_orig_lerobot", "pusht", "av"); it selects the model's
        per-domain action projections and fixes the action width D.
    raw_actions: forward_dynamics only: [T, D] numbers (an array, a nested list, or a tensor); a shorter
        sequence repeats its last action up to chunk_size, a longer one is cut to it.
    chunk_size: action steps in the chunk; the video has chunk_size + 1 frames.
    view_point: the camera framing sentence the model was trained with: "ego_view", "third_person_view",
        "wrist_view" or "concat_view".
    resolution_tier: the conditioning canvas family (256, 480, 704 or 720): the input is downscaled (never
        upscaled) and padded into the tier's canvas closest to its aspect ratio; the output keeps the input's size.
    """

    mode: str
    domain_name: str
    raw_actions: Any = field(default=None, compare=False, repr=False)
    chunk_size: int = 16
    view_point: str = "ego_view"
    resolution_tier: int = 480
