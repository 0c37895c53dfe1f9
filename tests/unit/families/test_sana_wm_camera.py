"""SANA-WM camera input: parsing and packing equal diffusers' SanaWM cam_utils; bad input names its field."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from PIL import Image

from vidloom.core.errors import InvalidRequest
from vidloom.families.sana_wm import camera as camera_module
from vidloom.families.sana_wm.camera import MAX_CAMERA_FRAMES, CameraInput, parse_action
from vidloom.families.sana_wm.trajectory import camera_tensors, crop_first_frame, snap_frames, trajectory

cam_utils = pytest.importorskip("diffusers.pipelines.sana_wm.cam_utils")

ACTIONS = ["w-80,jw-40", "w-3", "ik-4,none-2,dL-5", "i-100,l-3", "s-2, a-3，k-4", "jl-2,wasd-3"]


@pytest.mark.parametrize("action", ACTIONS)
def test_action_poses_equal_the_pipeline(action):
    np.testing.assert_array_equal(parse_action(action), cam_utils.action_string_to_c2w(action))


@pytest.mark.parametrize("bad", ["", "w", "w-0", "w--3", "q-5", "w-5,,a-3", "w-x", "-", "w-3.5"])
def test_malformed_action_is_refused_naming_camera(bad):
    with pytest.raises(InvalidRequest) as err:
        CameraInput.build(action=bad, intrinsics=[1, 1, 0, 0])
    assert err.value.field == "camera"
    with pytest.raises(ValueError):  # the pipeline refuses the same strings
        cam_utils.action_string_to_c2w(bad)


@pytest.mark.parametrize("kwargs, field", [
    (dict(), "camera"),
    (dict(action="w-3", c2w=np.eye(4)[None]), "camera"),
    (dict(action=5, intrinsics=[1, 1, 0, 0]), "camera"),
    (dict(c2w=np.eye(4), intrinsics=[1, 1, 0, 0]), "c2w"),
    (dict(c2w=np.zeros((3, 3, 4)), intrinsics=[1, 1, 0, 0]), "c2w"),
    (dict(c2w=[["a"]], intrinsics=[1, 1, 0, 0]), "c2w"),
    (dict(c2w=np.full((2, 4, 4), np.nan), intrinsics=[1, 1, 0, 0]), "c2w"),
    (dict(action="w-3"), "intrinsics"),
    (dict(action="w-3", intrinsics=[1, 2, 3]), "intrinsics"),
    (dict(action="w-3", intrinsics=np.zeros((2, 5))), "intrinsics"),
    (dict(action="w-3", intrinsics=[0, 1, 0, 0]), "intrinsics"),
])
def test_bad_camera_fields_name_the_field(kwargs, field):
    with pytest.raises(InvalidRequest) as err:
        CameraInput.build(**kwargs)
    assert err.value.field == field


def _deep(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


RIGID = np.tile(np.eye(4), (3, 1, 1))


@pytest.mark.parametrize("kwargs, field", [
    (dict(action="w-\u00b2", intrinsics=[1, 1, 0, 0]), "camera"),  # "²".isdigit() holds, int() refuses it
    (dict(action="w-" + "9" * 5000, intrinsics=[1, 1, 0, 0]), "camera"),  # past int()'s digit limit
    (dict(action=f"w-{MAX_CAMERA_FRAMES + 1}", intrinsics=[1, 1, 0, 0]), "camera"),
    (dict(action=f"w-{MAX_CAMERA_FRAMES // 2},a-{MAX_CAMERA_FRAMES // 2 + 1}", intrinsics=[1, 1, 0, 0]), "camera"),
    (dict(c2w=_deep(10_000), intrinsics=[1, 1, 0, 0]), "c2w"),
    (dict(c2w=[[[10**400, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]]], intrinsics=[1, 1, 0, 0]), "c2w"),
    (dict(c2w=np.zeros((3, 4, 4)), intrinsics=[1, 1, 0, 0]), "c2w"),  # no rotation
    (dict(c2w=RIGID * 1e38, intrinsics=[1, 1, 0, 0]), "c2w"),  # finite in float32, inf in the rays
    (dict(c2w=RIGID + np.pad(np.full((3, 3, 1), 2e4), ((0, 0), (0, 1), (3, 0))), intrinsics=[1, 1, 0, 0]), "c2w"),
    (dict(c2w=RIGID * np.array([1, 1, -1, 1])[:, None], intrinsics=[1, 1, 0, 0]), "c2w"),  # a reflection
    (dict(c2w=np.tile(np.eye(4), (MAX_CAMERA_FRAMES + 1, 1, 1)), intrinsics=[1, 1, 0, 0]), "c2w"),
    (dict(action="w-16", intrinsics=np.ones((5, 4))), "intrinsics"),  # 17 poses
    (dict(action="w-2", intrinsics=np.ones((4, 4))), "intrinsics"),
    (dict(c2w=RIGID, intrinsics=np.tile(np.eye(3), (2, 1, 1))), "intrinsics"),
    (dict(action="w-2", intrinsics=[1e38, 1, 0, 0]), "intrinsics"),
])
def test_unusable_cameras_are_refused_at_the_boundary(kwargs, field):
    with pytest.raises(InvalidRequest) as err:
        CameraInput.build(**kwargs)
    assert err.value.field == field


def test_checking_an_action_string_expands_no_pose(monkeypatch):
    """Validation counts segments; the poses are made when the job runs (off the server's event loop)."""
    def expand(action):
        raise AssertionError("expanded while checking")

    monkeypatch.setattr(camera_module, "parse_action", expand)
    camera = CameraInput.build(action=f"w-{MAX_CAMERA_FRAMES - 1}", intrinsics=[1, 1, 0, 0])
    assert camera.action == f"w-{MAX_CAMERA_FRAMES - 1}"


def test_per_frame_intrinsics_give_one_row_per_pose():
    camera = CameraInput.build(action="w-16", intrinsics=np.ones((17, 4)))
    assert trajectory(camera, 17, 8).intrinsics.shape == (17, 4)


@pytest.mark.parametrize("n, upper", [(1, 9), (5, 40), (12, 40), (13, 40), (40, 40), (161, 200), (30, 30)])
def test_snap_frames_equals_the_pipeline(n, upper):
    assert snap_frames(n, 8, upper) == cam_utils.snap_num_frames(n, 8, upper_bound=upper)


def _pipeline_trajectory(action, c2w, intrinsics, frames):
    from diffusers.pipelines.sana_wm.pipeline_sana_wm import SanaWMPipeline

    fake = type("P", (), {"vae_temporal_compression_ratio": 8})()
    return SanaWMPipeline.prepare_camera_trajectory(fake, c2w, action, intrinsics, frames)


@pytest.mark.parametrize("action, c2w, intrinsics, frames", [
    ("w-20,jw-12", None, [50.0, 52.0, 35.0, 20.0], 25),
    ("ik-10", None, np.array([[50.0, 0, 30], [0, 55, 21], [0, 0, 1]]), 40),
    (None, cam_utils.action_string_to_c2w("l-30"), np.tile([40.0, 40.0, 30.0, 20.0], (31, 1)), 17),
    (None, cam_utils.action_string_to_c2w("dw-16"), np.tile(np.array([[40.0, 0, 30], [0, 40, 20], [0, 0, 1]]),
                                                           (17, 1, 1)), 30),
])
def test_camera_tensors_equal_the_pipeline(action, c2w, intrinsics, frames):
    camera = CameraInput.build(action=action, c2w=c2w, intrinsics=intrinsics)
    traj = trajectory(camera, frames, 8)
    ref_c2w, ref_intr = _pipeline_trajectory(action, c2w, intrinsics, frames)
    np.testing.assert_array_equal(traj.c2w, ref_c2w)
    np.testing.assert_array_equal(traj.intrinsics, ref_intr)

    image = Image.fromarray((np.random.RandomState(0).rand(50, 70, 3) * 255).astype(np.uint8))
    cropped, intr = crop_first_frame(image, traj.intrinsics, 64, 96)
    ref_img, *geometry = cam_utils.resize_and_center_crop(image, 64, 96)
    ref_intr = cam_utils.transform_intrinsics_for_crop(ref_intr, *geometry)
    np.testing.assert_array_equal(np.asarray(cropped), np.asarray(ref_img))
    np.testing.assert_allclose(intr, ref_intr, rtol=0, atol=0)

    raymap, plucker = camera_tensors(dataclasses.replace(traj, intrinsics=intr), (64, 96), 8, 32)
    ref = cam_utils.prepare_camera(ref_c2w, ref_intr, target_size=(64, 96), vae_stride=(8, 32, 32))
    torch.testing.assert_close(raymap, ref["raymap"], rtol=0, atol=0)
    torch.testing.assert_close(plucker, ref["chunk_plucker"], rtol=0, atol=0)


@pytest.mark.parametrize("height, width, field", [(32, 64, "height"), (64, 32, "width")])
def test_a_size_under_two_latent_cells_is_refused_before_the_job(height, width, field):
    """64x32 was accepted and every such job then failed in the VAE's decode (a 1-cell latent side)."""
    from vidloom.families.sana_wm.cards import DEFAULTS, sana_wm_card
    from vidloom.generator import build_request
    from vidloom.media.request_inputs import resolve_request

    card = sana_wm_card("tiny", "/nowhere", multiple=32, temporal=8, defaults=DEFAULTS, description="test")
    fields = dict(image=Image.new("RGB", (64, 64)), camera="w-8", intrinsics=[100.0, 100.0, 32.0, 32.0],
                  num_frames=9)
    with pytest.raises(InvalidRequest) as err:
        resolve_request(build_request(card, "a road", height=height, width=width, **fields), card)
    assert err.value.field == field and "64" in err.value.message
    assert resolve_request(build_request(card, "a road", height=64, width=64, **fields), card).height == 64
