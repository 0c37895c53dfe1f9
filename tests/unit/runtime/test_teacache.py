"""TeaCache against its published decision rule, on indicator sequences whose skip pattern is derived by hand.

Rule (Liu et al. 2024, arXiv:2411.19108; ali-vilab/TeaCache reference code): per branch, add the
(rescaled) relative L1 change of the indicator since the previous step to an accumulator; below the
threshold, reuse the cached residual; at or above it, compute the blocks and reset the accumulator to 0.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vidloom.core.deploy import DeployConfig
from vidloom.core.loop import NETWORK, StepPlan
from vidloom.core.request import GenerationRequest
from vidloom.core.denoiser import TeaCacheRescale
from vidloom.families.wan.teacache import WAN21_TEACACHE
from vidloom.runtime.step_cache import StepCache, TeaCache, make_step_cache


class IndicatorNet:
    """A staged network whose TeaCache indicator at each call is a constant tensor of a chosen value."""

    num_blocks = 3

    def __init__(self) -> None:
        self.computed: list[int] = []  # step indices at which the blocks ran

    def embed(self, latents, timestep, text_embeds):
        return latents.clone(), {"indicator": text_embeds, "step": int(timestep)}

    def run_blocks(self, x, cond, start=0, end=None):
        self.computed.append(cond["step"])
        return x + 1.0

    def block_input(self, x, cond, index=0):
        return cond["indicator"]

    def head(self, x, cond):
        return x


def _run(policy: TeaCache, indicator_values: list[float], threshold: float) -> str:
    """Run one branch over steps whose indicators take `indicator_values`; 'C' computed, 'S' skipped."""
    net, cache = IndicatorNet(), StepCache(policy, threshold)
    total = len(indicator_values)
    for step, value in enumerate(indicator_values):
        plan = StepPlan(
            "denoise", step, total, call=lambda network, latents, timestep, text_embeds: network(latents, timestep, text_embeds),
            inputs={NETWORK: net, "latents": torch.zeros(1, 2), "timestep": torch.tensor(step),
                    "text_embeds": torch.full((1, 4), value, dtype=torch.float64)},
        )
        cache.execute(plan)
    return "".join("C" if step in net.computed else "S" for step in range(total))


def _values(distances: list[float], start: float = 1.0) -> list[float]:
    """Indicator values whose consecutive relative L1 changes are exactly `distances` (growing values)."""
    values = [start]
    for d in distances:
        values.append(values[-1] * (1.0 + d))
    return values


# Steps 1..9 change by these relative amounts. By hand, threshold 0.1 (accumulator after adding -> decision):
# 0: first step computes | 1: .04 S | 2: .08 S | 3: .12 C reset | 4: .30 C reset | 5: .01 S | 6: .06 S
# 7: .11 C reset | 8: .09 S | 9: .18 C reset
DISTANCES = [0.04, 0.04, 0.04, 0.30, 0.01, 0.05, 0.05, 0.09, 0.09]
HAND_PATTERN = "CSSCCSSCSC"


def test_skip_pattern_matches_the_hand_derived_one():
    assert _run(TeaCache(), _values(DISTANCES), threshold=0.1) == HAND_PATTERN


def test_a_never_reset_accumulator_gives_another_pattern():
    # Without the reset the sum passes 0.1 at step 3 and stays above it: every later step computes.
    # This pins the reset: a TeaCache that forgets it fails the test above.
    never_reset = "CSSC" + "C" * 6
    assert never_reset != HAND_PATTERN
    assert _run(TeaCache(), _values(DISTANCES), threshold=0.1) != never_reset


def test_threshold_zero_computes_every_step_and_huge_threshold_only_the_first():
    assert _run(TeaCache(), _values(DISTANCES), threshold=0.0) == "C" * 10
    # An unchanged indicator adds 0: the sum reaches a threshold of 0, so 0 still never skips.
    assert _run(TeaCache(), [2.0] * 5, threshold=0.0) == "C" * 5
    assert _run(TeaCache(), _values(DISTANCES), threshold=1e6) == "C" + "S" * 9


def test_rescale_polynomial_and_warmup_steps():
    # rescale(d) = 2d + 0.01 and 2 warm-up steps. By hand, threshold 0.24:
    # 0, 1: warm-up, computed, accumulator stays 0 | 2: 2*.04+.01=.09 S | 3: .18 S | 4: .18+.61 C reset
    # 5: .03 S | 6: .14 S | 7: .25 C reset | 8: .19 S | 9: .38 C reset
    rescale = TeaCacheRescale((2.0, 0.01), lambda net, x, cond: cond["indicator"], warmup_steps=2)
    assert _run(TeaCache(rescale), _values(DISTANCES), threshold=0.24) == "CCSSCSSCSC"


def test_published_wan_coefficients_evaluate_like_numpy_poly1d():
    for model_id in ("wan2.1-t2v-1.3b", "wan2.1-t2v-14b"):
        rescale = WAN21_TEACACHE[model_id]
        for d in (0.0, 0.003, 0.02, 0.1):
            assert rescale(d) == pytest.approx(float(np.poly1d(rescale.coefficients)(d)), rel=1e-12, abs=1e-12)
        assert rescale.warmup_steps == 5  # use_ret_steps=True: the first 5 steps always compute
    # The 1.3B values as published (TeaCache4Wan2.1, use_ret_steps=True); a typo would change every decision.
    assert WAN21_TEACACHE["wan2.1-t2v-1.3b"].coefficients == (
        -5.21862437e04, 9.23041404e03, -5.28275948e02, 1.36987616e01, -4.99875664e-02
    )


def test_real_wan_checkpoints_get_the_published_rescale_and_others_raw_rel_l1():
    deploy, request = DeployConfig(step_cache="teacache"), GenerationRequest("p")
    from vidloom.families.wan.cards import wan21_t2v_14b
    from vidloom.families.wan.demo import demo_card

    real = make_step_cache(deploy, request, wan21_t2v_14b().teacache)
    assert real.policy.rescale is WAN21_TEACACHE["wan2.1-t2v-14b"]
    assert make_step_cache(deploy, request, demo_card().teacache).policy.rescale is None
    assert make_step_cache(deploy, request).policy.rescale is None


def test_wan_indicator_is_the_time_modulation():
    from vidloom.models.wan.transformer import WanTransformer
    from vidloom.models.wan.transformer_config import WanTransformerConfig

    torch.manual_seed(0)
    cfg = WanTransformerConfig(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4,
        text_dim=16, freq_dim=16, ffn_dim=32, num_layers=1, rope_max_seq_len=32,
    )
    net = WanTransformer(cfg).eval()
    x, cond = net.embed(torch.randn(1, 4, 1, 4, 4), torch.tensor([500.0]), torch.randn(1, 3, 16))
    probe = WAN21_TEACACHE["wan2.1-t2v-1.3b"].indicator(net, x, cond)
    assert probe.shape == (1, 6, cfg.inner_dim) and torch.equal(probe, cond.time_mod)
