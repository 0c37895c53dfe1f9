"""SANA-WM's camera block: an action string or explicit poses, and the pinhole intrinsics."""

from __future__ import annotations

from vidloom.core.options import Option, OptionBlock

CAMERA = OptionBlock(
    "camera",
    (Option("camera", "str", "a WASD/IJKL action string such as 'w-80,jw-40' (move / look, frames per segment)",
            metavar="ACTIONS"),
     Option("c2w", "array", "[F, 4, 4] camera-to-world poses instead of camera (CLI: a .npy or .json file)",
            metavar="FILE"),
     Option("intrinsics", "array", "pinhole intrinsics fx,fy,cx,cy in the first image's pixels (or a 3x3 K / "
                                   "per-frame values; CLI: a .npy or .json file)", metavar="FX,FY,CX,CY|FILE")),
    summary="camera-controlled world models (SANA-WM): the camera path",
    refusal="it is not a camera-controlled world model",
)
