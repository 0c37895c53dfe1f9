"""Position encodings of the SANA-WM DiT: the complex 3D RoPE table and UCPE per-ray camera transforms.

UCPE (unified camera positional encoding) gives every latent token a 4x4 `ray <- world` transform built
from its pixel ray and the frame's camera pose; the camera branch of each attention block rotates half of
every head by it and RoPE-rotates the other half. The geometry follows diffusers' SanaWMTransformer3DModel
(`_process_camera_conditions_ucpe`, `world_to_ray_mats`, `_apply_ucpe_transform`) step by step for parity,
restricted to the pinhole camera (UCM xi = 0) that the released model uses.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

ROPE_THETA = 10000.0
ROPE_MAX_POSITIONS = 1024


def _axis_dims(head_dim: int) -> tuple[int, int, int]:
    """Complex frequencies per axis (frames, height, width): Wan's split of a head."""
    hw = head_dim // 6
    return head_dim // 2 - 2 * hw, hw, hw


def _axis_frequencies(dim: int, positions: int) -> Tensor:
    # diffusers' get_1d_rotary_pos_embed(use_real=False), float32 frequencies.
    inv = 1.0 / (ROPE_THETA ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    angles = torch.outer(torch.arange(positions), inv)
    return torch.polar(torch.ones_like(angles), angles)


def rope_table(head_dim: int, grid: tuple[int, int, int], device: torch.device) -> Tensor:
    """Complex rotations [1, 1, F*H*W, head_dim/2] for tokens laid out frame-major."""
    nf, nh, nw = _axis_dims(head_dim)
    t_dim = head_dim - 4 * nh  # axis widths in real channels: frames take what height and width leave
    tables = [_axis_frequencies(d, ROPE_MAX_POSITIONS)[:, :n] for d, n in ((t_dim, nf), (2 * nh, nh), (2 * nw, nw))]
    f, h, w = grid
    parts = (
        tables[0][:f].view(f, 1, 1, -1).expand(f, h, w, -1),
        tables[1][:h].view(1, h, 1, -1).expand(f, h, w, -1),
        tables[2][:w].view(1, 1, w, -1).expand(f, h, w, -1),
    )
    return torch.cat(parts, dim=-1).reshape(1, 1, f * h * w, -1).to(device)


def camera_rope(table: Tensor, head_dim: int) -> Tensor:
    """The RoPE rotations for the camera branch's half-width rotary part: the leading frequencies of each axis."""
    nf, nh, _ = _axis_dims(head_dim)
    cf, ch, cw = _axis_dims(head_dim // 2)
    return torch.cat([table[..., :cf], table[..., nf:nf + ch], table[..., nf + nh:nf + nh + cw]], dim=-1)


def apply_rope(x: Tensor, table: Tensor, inverse: bool = False) -> Tensor:
    """Rotate adjacent channel pairs of x [B, H, N, D] by table [1, 1, N, D/2], in float32."""
    freqs = table.conj() if inverse else table
    pairs = torch.view_as_complex(x.float().contiguous().unflatten(-1, (-1, 2)))
    return torch.view_as_real(pairs * freqs).flatten(-2).type_as(x)


@dataclass(frozen=True)
class RayTransforms:
    """Per-token UCPE transforms, shared by every block of one forward."""

    world_to_ray: Tensor  # P [B, N, 4, 4]: decodes the camera branch's output
    query: Tensor  # P^T [B, N, 4, 4]: encodes queries
    key_value: Tensor  # P^-1 [B, N, 4, 4]: encodes keys and values
    rope: Tensor  # camera-branch RoPE rotations [1, 1, N, head_dim/4]


def ray_transforms(camera: Tensor, grid: tuple[int, int, int], patch: tuple[int, int, int],
                   rope: Tensor, head_dim: int) -> RayTransforms:
    """camera [B, F, 20] (flattened c2w + fx, fy, cx, cy in latent pixels) -> the UCPE transforms."""
    with torch.autocast(device_type=camera.device.type, enabled=False):
        raymats = _world_to_ray(camera, grid, patch)
    p = raymats.reshape(camera.shape[0], -1, 4, 4)
    return RayTransforms(world_to_ray=p, query=p.transpose(-1, -2), key_value=_invert_rigid(p),
                         rope=camera_rope(rope, head_dim))


def _token_focal(focal: Tensor, pixels: int, tokens: int) -> Tensor:
    """A focal length in latent pixels -> in tokens, through the field of view as the reference does it
    (focal -> FoV in degrees -> focal, UCM with xi = 0); in bfloat16 the round trip itself rounds."""
    a = 2.0 * focal / pixels
    fov = torch.rad2deg(2.0 * (torch.asin(torch.zeros_like(a).clamp(-1.0, 1.0)) + torch.atan(1.0 / a)))
    theta = torch.deg2rad(0.5 * fov)
    return (tokens * 0.5) * torch.cos(theta) / torch.sin(theta).clamp_min(torch.finfo(focal.dtype).eps)


def _pixel_rays(camera: Tensor, grid: tuple[int, int, int], patch: tuple[int, int, int]) -> Tensor:
    """Unit camera-frame rays [B, F, H, W, 3] through each token centre (pinhole: the UCM with xi = 0)."""
    b, f = camera.shape[:2]
    _, h, w = grid
    fx, fy = _token_focal(camera[..., 16], w * patch[2], w), _token_focal(camera[..., 17], h * patch[1], h)
    cx, cy = camera[..., 18] / patch[2], camera[..., 19] / patch[1]
    v, u = torch.meshgrid(torch.linspace(0, h - 1, h, dtype=camera.dtype, device=camera.device),
                          torch.linspace(0, w - 1, w, dtype=camera.dtype, device=camera.device), indexing="ij")
    x = (u - cx[..., None, None]) / fx[..., None, None]
    y = (v - cy[..., None, None]) / fy[..., None, None]
    r2 = x * x + y * y
    gamma = torch.sqrt(1 + r2) / (1 + r2)
    return torch.stack([gamma * x, gamma * y, gamma], dim=-1).view(b, f, h, w, 3)


def _world_to_ray(camera: Tensor, grid: tuple[int, int, int], patch: tuple[int, int, int]) -> Tensor:
    """[B, F, H, W, 4, 4] transforms into each ray's frame (z along the ray, x orthogonal to the camera's y)."""
    b, f = camera.shape[:2]
    _, h, w = grid
    c2w = camera[..., :16].reshape(b, f, 4, 4)
    rotation, origin = c2w[..., :3, :3], c2w[..., :3, 3]
    rays = torch.einsum("btij,bthwj->bthwi", rotation, _pixel_rays(camera, grid, patch))
    cam_y = rotation[..., :, 1][:, :, None, None, :].expand(-1, -1, h, w, -1)
    z = F.normalize(rays, dim=-1, eps=1e-6)
    x = F.normalize(torch.cross(cam_y, z, dim=-1), dim=-1, eps=1e-6)
    y = F.normalize(torch.cross(z, x, dim=-1), dim=-1, eps=1e-6)
    world_to_local = torch.stack([x, y, z], dim=-1).transpose(-1, -2)
    shift = -torch.einsum("bthwij,bthwj->bthwi", world_to_local, origin[:, :, None, None, :].expand(-1, -1, h, w, -1))
    out = torch.zeros(b, f, h, w, 4, 4, dtype=camera.dtype, device=camera.device)
    out[..., :3, :3] = world_to_local
    out[..., :3, 3] = shift
    out[..., 3, 3] = 1.0
    return out


def _invert_rigid(transforms: Tensor) -> Tensor:
    rotation_t = transforms[..., :3, :3].transpose(-1, -2)
    out = torch.zeros_like(transforms)
    out[..., :3, :3] = rotation_t
    out[..., :3, 3] = -torch.einsum("...ij,...j->...i", rotation_t, transforms[..., :3, 3])
    out[..., 3, 3] = 1.0
    return out


def apply_ucpe(x: Tensor, matrix: Tensor, rope: Tensor, inverse_rope: bool = False) -> Tensor:
    """x [B, H, N, D]: the first half of each head as 4-vectors times matrix [B, N, 4, 4]; RoPE on the second."""
    b, heads, n, d = x.shape
    projected, rotated = x.split(d // 2, dim=-1)
    projected = torch.einsum("bnij,bhnkj->bhnki", matrix, projected.reshape(b, heads, n, -1, 4))
    return torch.cat([projected.reshape(b, heads, n, d // 2), apply_rope(rotated, rope, inverse_rope)], dim=-1)
