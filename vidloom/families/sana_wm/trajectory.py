"""Camera trajectory -> the DiT's camera tensors, and the first frame's resize + crop with its intrinsics.

Follows diffusers' SanaWMPipeline (`prepare_camera_trajectory`, `SanaWMImageProcessor`, cam_utils'
`prepare_camera` / `compute_raymap`) so the same request conditions the model identically.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from vidloom.core.errors import InvalidRequest
from vidloom.families.sana_wm.camera import CameraInput, _as_vec4


def snap_frames(n: int, stride: int, upper: int) -> int:
    """The nearest 1 + stride*k to n (ties go up), not above `upper` (the LTX-2 VAE's frame counts)."""
    if n < 1:
        return 1
    below = n - (n - 1) % stride
    if below == n:
        return n
    snapped = below if (n - below) < (below + stride - n) else below + stride
    return max(below if snapped > upper else snapped, 1)


@dataclass(frozen=True)
class Trajectory:
    c2w: np.ndarray  # [F, 4, 4]
    intrinsics: np.ndarray  # [F, 4] fx, fy, cx, cy in original-image pixels


def trajectory(camera: CameraInput, num_frames: int, time_stride: int) -> Trajectory:
    """Poses and per-frame intrinsics for min(num_frames, len(poses)) frames snapped to 1 + stride*k."""
    poses = camera.poses()
    frames = snap_frames(min(num_frames, poses.shape[0]), time_stride, poses.shape[0])
    intr = _as_vec4(np.asarray(camera.intrinsics, dtype=np.float32))
    if intr.shape == (4,):
        intr = np.broadcast_to(intr, (frames, 4)).copy()
    if intr.shape[0] < frames:
        raise InvalidRequest("intrinsics", f"per-frame intrinsics cover {intr.shape[0]} frames, the camera "
                             f"trajectory needs {frames}")
    return Trajectory(c2w=poses[:frames], intrinsics=intr[:frames])


def crop_first_frame(image: Image.Image, intrinsics: np.ndarray, height: int, width: int
                     ) -> tuple[Image.Image, np.ndarray]:
    """Aspect-preserving Lanczos resize to cover (height, width), centre crop, intrinsics moved alike."""
    src_w, src_h = image.size
    scale = max(height / src_h, width / src_w)
    rw, rh = max(width, int(round(src_w * scale))), max(height, int(round(src_h * scale)))
    left, top = (rw - width) // 2, (rh - height) // 2
    cropped = image.resize((rw, rh), Image.LANCZOS).crop((left, top, left + width, top + height))
    out = intrinsics.copy()
    sx, sy = rw / src_w, rh / src_h
    out[..., 0] *= sx
    out[..., 2] = out[..., 2] * sx - left
    out[..., 1] *= sy
    out[..., 3] = out[..., 3] * sy - top
    return cropped, out


def _invert_rigid(pose: torch.Tensor) -> torch.Tensor:
    rt = pose[..., :3, :3].transpose(-1, -2)
    out = torch.zeros_like(pose)
    out[..., :3, :3] = rt
    out[..., :3, 3:] = -rt @ pose[..., :3, 3:]
    out[..., 3, 3] = 1.0
    return out


def plucker_rays(intrinsics: torch.Tensor, poses: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """[T, H, W, 6]: world ray direction d and moment o x d through every pixel."""
    t = intrinsics.shape[0]
    ys, xs = torch.meshgrid(torch.arange(height, dtype=intrinsics.dtype), torch.arange(width, dtype=intrinsics.dtype),
                            indexing="ij")
    xs, ys = xs[None].expand(t, -1, -1), ys[None].expand(t, -1, -1)
    fx, fy, cx, cy = (intrinsics[:, i].view(t, 1, 1) for i in range(4))
    dirs = torch.stack([(xs - cx) / fx, (ys - cy) / fy, torch.ones_like(xs)], dim=-1)
    world = torch.einsum("tij,thwj->thwi", poses[:, :3, :3], dirs)
    world = world / torch.norm(world, dim=-1, keepdim=True)
    origins = poses[:, :3, 3].view(t, 1, 1, 3).expand_as(world)
    return torch.cat([world, torch.cross(origins, world, dim=-1)], dim=-1)


def camera_tensors(traj: Trajectory, size: tuple[int, int], time_stride: int, spatial_stride: int
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """(raymap [T_lat, 20], plucker [6 * time_stride, T_lat, h, w]) for cropped-image intrinsics.

    raymap: each latent frame's pose relative to the first frame (flattened 4x4) and its intrinsics in
    latent pixels; plucker: the rays of the `time_stride` pixel frames each latent frame covers.
    """
    height, width = size
    lat_h, lat_w = height // spatial_stride, width // spatial_stride
    frames = traj.c2w.shape[0]
    lat_t = (frames - 1) // time_stride + 1
    poses = torch.from_numpy(np.ascontiguousarray(traj.c2w)).float()
    relative = torch.matmul(_invert_rigid(poses[0:1]).squeeze(0), poses[1:])
    poses = torch.cat([torch.eye(4)[None], relative], dim=0)
    intr = torch.from_numpy(np.ascontiguousarray(traj.intrinsics)).float().clone()
    intr[:, [0, 2]] *= lat_w / float(width)
    intr[:, [1, 3]] *= lat_h / float(height)
    index = torch.arange(0, frames, time_stride)[:lat_t]
    raymap = torch.cat([poses[index].reshape(len(index), -1), intr[index]], dim=-1)
    chunks = []
    for start in (index - (time_stride - 1)).tolist():
        s = max(0, start)
        p, k = poses[s:s + time_stride], intr[s:s + time_stride]
        if p.shape[0] < time_stride:  # the first latent frame covers one pixel frame: repeat it
            pad = time_stride - p.shape[0]
            p, k = torch.cat([p, p[-1:].repeat(pad, 1, 1)]), torch.cat([k, k[-1:].repeat(pad, 1)])
        rays = plucker_rays(k, p, lat_h, lat_w)
        chunks.append(rays.permute(0, 3, 1, 2).reshape(-1, lat_h, lat_w))
    return raymap, torch.stack(chunks).permute(1, 0, 2, 3)
