"""`vidloom generate` flags of world models with an action pathway (Cosmos3): the action block and its files.

--action-mode picks the run (forward_dynamics | policy | inverse_dynamics), --domain the embodiment,
--actions the [T, D] actions to roll out (a float .npy, or JSON: a list of rows or {"actions": rows}),
--actions-out where the predicted actions go (.npy float32, or .json). Everything is checked before loading.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vidloom.core.action import ACTION_MODES, ActionInput
from vidloom.core.errors import InvalidRequest

if TYPE_CHECKING:
    import numpy as np

ACTION_FLAGS = {"action": "--action-mode", "action.mode": "--action-mode", "action.domain_name": "--domain",
                "action.raw_actions": "--actions", "actions": "--actions", "action.chunk_size": "--chunk-size",
                "action.view_point": "--view-point", "action.resolution_tier": "--resolution-tier",
                "actions_out": "--actions-out"}
ACTION_FILES = (".npy", ".json")
DEFAULT_CHUNK = 16


def add_action_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("world models with an action pathway (Cosmos3)")
    group.add_argument("--action-mode", default=None, choices=ACTION_MODES,
                       help="forward_dynamics: --image + --actions -> video; policy: --image -> video + actions; "
                            "inverse_dynamics: --video -> actions")
    group.add_argument("--domain", default=None, metavar="NAME",
                       help="the embodiment (e.g. bridge_orig_lerobot, pusht, av); fixes the action width")
    group.add_argument("--actions", default=None, metavar="FILE.npy|FILE.json",
                       help="forward_dynamics: the [T, D] actions to roll out")
    group.add_argument("--actions-out", default=None, metavar="FILE.npy|FILE.json",
                       help="policy / inverse_dynamics: write the predicted [T, D] float32 actions here")
    group.add_argument("--chunk-size", type=int, default=None,
                       help=f"action steps (a multiple of 4; video: steps + 1 frames); default: the number of "
                            f"--actions, else {DEFAULT_CHUNK}")
    group.add_argument("--view-point", default="ego_view",
                       help="camera framing: ego_view | third_person_view | wrist_view | concat_view")
    group.add_argument("--resolution-tier", type=int, default=480, help="conditioning canvas: 256 | 480 | 704 | 720")


def action_block(args: argparse.Namespace) -> ActionInput | None:
    """The action block the flags describe, or None without --action-mode; InvalidRequest naming the field."""
    used = [flag for flag, value in (("--domain", args.domain), ("--actions", args.actions),
                                     ("--actions-out", args.actions_out), ("--chunk-size", args.chunk_size))
            if value is not None]
    if args.action_mode is None:
        if used:
            raise InvalidRequest("action", f"{used[0]} needs --action-mode")
        return None
    if args.domain is None:
        raise InvalidRequest("action.domain_name", "--action-mode needs --domain (the embodiment)")
    raw = read_actions(Path(args.actions)) if args.actions is not None else None
    if args.actions_out is not None:
        check_actions_out(Path(args.actions_out), args.action_mode)
    chunk = args.chunk_size if args.chunk_size is not None else (len(raw) if raw is not None else DEFAULT_CHUNK)
    return ActionInput(mode=args.action_mode, domain_name=args.domain, raw_actions=raw, chunk_size=chunk,
                       view_point=args.view_point, resolution_tier=args.resolution_tier)


def read_actions(path: Path) -> np.ndarray:
    """A [T, D] float32 array from .npy (no pickles) or .json (rows, or {"actions": rows})."""
    import numpy as np

    if path.suffix.lower() not in ACTION_FILES:
        raise InvalidRequest("actions", f"{path.name}: give a .npy or .json file")
    if not path.is_file():
        raise InvalidRequest("actions", f"{path}: no such file")
    try:
        if path.suffix.lower() == ".npy":
            value: Any = np.load(path, allow_pickle=False)
        else:
            value = json.loads(path.read_text(encoding="utf-8"))
            value = value.get("actions") if isinstance(value, dict) else value
        array = np.asarray(value, dtype=np.float32)
    except (ValueError, TypeError, OSError, UnicodeDecodeError) as exc:
        raise InvalidRequest("actions", f"{path.name}: not a [T, D] array of numbers ({exc})") from None
    if array.ndim != 2:
        raise InvalidRequest("actions", f"{path.name}: must hold a [T, D] array, got shape {list(array.shape)}")
    return array


def check_actions_out(path: Path, mode: str) -> None:
    if mode == "forward_dynamics":
        raise InvalidRequest("actions_out", "forward_dynamics takes the actions and predicts none; drop --actions-out")
    if path.suffix.lower() not in ACTION_FILES:
        raise InvalidRequest("actions_out", f"{path.name}: give a .npy or .json file")
    if not path.resolve().parent.is_dir():
        raise InvalidRequest("actions_out", f"{path.parent}: no such directory")


def write_actions(path: Path, actions: np.ndarray, metadata: dict[str, Any]) -> Path:
    """Write the predicted actions (.npy float32, or JSON with the block's mode and domain)."""
    import numpy as np

    if path.suffix.lower() == ".npy":
        with open(path, "wb") as file:
            np.save(file, np.ascontiguousarray(actions, dtype=np.float32), allow_pickle=False)
    else:
        block = dict(metadata.get("action") or {})
        path.write_text(json.dumps({**block, "shape": list(actions.shape), "actions": actions.tolist()}),
                        encoding="utf-8")
    return path
