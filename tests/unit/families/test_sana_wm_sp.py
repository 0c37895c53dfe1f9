"""SANA-WM's stage-1 DiT under sequence parallel (bands of patch rows of every frame), ranks as threads.

Both block kinds (gated delta rule and softmax), both attention branches (main and camera), the short convolutions
over frames, the frame-mean decay gate and the FFN's 3x3 convolution across band edges, over 2 and 4 ranks.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from tests.helpers.thread_comm import run_ranks, thread_group
from vidloom.families.sana_wm.config import SanaWMConfig
from vidloom.families.sana_wm.parallel import FrameRows
from vidloom.families.sana_wm.transformer import SanaWMTransformer
from vidloom.runtime.parallel.ulysses import apply_sp

# These weights (0.3 randn everywhere) amplify rounding: one device's float32 output is up to ~4e-4 of its peak from
# float64's. So the split is checked exactly in float64 (summation order only), and in float32 against float64's
# output no further off than one device's float32 output is (its kernels' blocking follows the shapes, per CPU).
REL_TOL_64 = 1e-12  # of the output's peak (~90)
# Four self-attention heads (64 / 16): sp 2 and 4 split them. Q/K/V short convs; block 1 is a softmax block.
CONFIG = SanaWMConfig(in_channels=8, num_layers=2, hidden_size=64, num_attention_heads=2, linear_head_dim=16,
                      softmax_every_n=2, mlp_ratio=2.0, conv_kernel_size=4, k_conv_only=False, t_kernel_size=3,
                      chunk_plucker_channels=48, caption_channels=16)


def _model() -> SanaWMTransformer:
    torch.manual_seed(0)
    model = SanaWMTransformer(CONFIG).eval()
    with torch.no_grad():  # zero-initialised tables, gates and convs get values, so every path moves the output
        for p in model.parameters():
            p.copy_(0.3 * torch.randn(p.shape))
    return model


def _inputs(rows: int) -> tuple[torch.Tensor, ...]:
    """3 latent frames of `rows` x 3 patches, a moving camera, a padded prompt."""
    from diffusers.pipelines.sana_wm.cam_utils import action_string_to_c2w, prepare_camera

    g = torch.Generator().manual_seed(1)
    c2w = action_string_to_c2w("w-8,jw-8,ik-2")[:17]
    intrinsics = np.tile(np.array([40.0, 44.0, 30.0, 20.0], np.float32), (17, 1))
    cam = prepare_camera(c2w, intrinsics, target_size=(32 * rows, 96), vae_stride=(8, 32, 32))
    mask = torch.ones(1, 7, dtype=torch.long)
    mask[0, 5:] = 0
    return (torch.randn(1, 8, 3, rows, 3, generator=g), torch.tensor([[0.0, 700.4, 700.4]]),
            torch.randn(1, 7, 16, generator=g), mask, cam["raymap"][None], cam["chunk_plucker"][None])


@pytest.mark.parametrize(("size", "rows"), [(2, 4), (4, 4), (2, 2)])
def test_frame_row_bands_match_one_device(size, rows):
    model, inputs = _model(), _inputs(rows)
    model64 = copy.deepcopy(model).double()
    inputs64 = tuple(x.double() if x.is_floating_point() else x for x in inputs)
    with torch.inference_mode():
        reference, reference64 = model(*inputs), model64(*inputs64)
    peak = reference64.abs().max().item()
    assert peak > 0.1
    one_device_error = (reference.double() - reference64).abs().max().item()

    def split(net: SanaWMTransformer, args: tuple[torch.Tensor, ...]):
        def one_rank(comm) -> torch.Tensor:
            replica = copy.deepcopy(net)
            apply_sp(replica, comm)
            assert isinstance(replica.sequence, FrameRows)
            with torch.inference_mode():
                return replica(*args)
        return run_ranks(thread_group(size), one_rank)

    for out in split(model64, inputs64):
        assert out.shape == reference.shape
        assert (out - reference64).abs().max().item() <= REL_TOL_64 * peak
    for out in split(model, inputs):
        assert (out.double() - reference64).abs().max().item() <= 2 * one_device_error + 1e-6 * peak


def test_rows_that_do_not_split_are_refused():
    (comm, _) = thread_group(2)
    with pytest.raises(ValueError, match="3 patch rows do not split over sp=2"):
        FrameRows(comm).band((2, 3, 4))
