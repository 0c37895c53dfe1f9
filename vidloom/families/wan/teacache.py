"""TeaCache's published calibration for Wan2.1 T2V checkpoints, declared on their cards (ModelCard.teacache)."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from vidloom.core.denoiser import StagedDenoiser, Stream, TeaCacheRescale


def _wan_time_modulation(net: StagedDenoiser, x: Stream, cond: Any) -> Tensor:
    # Wan's `e0`: the shared per-block modulation [B, 6, D] (diffusers' condition_embedder.time_proj
    # output), the input TeaCache4Wan2.1 measures with use_ret_steps=True.
    return cond.time_mod


# TeaCache's published Wan2.1 T2V rescale polynomials, use_ret_steps=True variant (the one whose
# indicator is e0, with the first 5 steps always computed): ali-vilab/TeaCache,
# TeaCache4Wan2.1/teacache_generate.py (also in DiffSynth-Studio's Wan pipeline). They were fitted
# on the real weights, so they apply only to those checkpoints; random-weight demos and unknown
# folders fall back to raw relative L1 of block 0's modulated input.
WAN21_TEACACHE: dict[str, TeaCacheRescale] = {
    "wan2.1-t2v-1.3b": TeaCacheRescale(
        (-5.21862437e04, 9.23041404e03, -5.28275948e02, 1.36987616e01, -4.99875664e-02), _wan_time_modulation, 5
    ),
    "wan2.1-t2v-14b": TeaCacheRescale(
        (-3.03318725e05, 4.90537029e04, -2.65530556e03, 5.87365115e01, -3.15583525e-01), _wan_time_modulation, 5
    ),
}
"""model_id -> TeaCache's calibrated indicator; models not listed use raw relative L1 (runtime.step_cache)."""
