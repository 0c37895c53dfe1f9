"""What SamplerConfig.from_diffusers does with each scheduler_config.json key, per diffusers scheduler class.

Every __init__ argument of UniPCMultistepScheduler, FlowMatchEulerDiscreteScheduler and
FlowMapEulerDiscreteScheduler since each class's first release (none was ever removed: the diffusers history
walk of issue #33) is read, harmless or refused by value. A refused key also has the default diffusers uses when
the file lacks it: a missing key whose default we do not run is refused as well (UniPC defaults to epsilon
prediction without flow sigmas, for one).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vidloom.core.errors import CheckpointError
from vidloom.loading.key_policy import KeyPolicy, Refusal

UNIPC_CLASS = "UniPCMultistepScheduler"
EULER_CLASS = "FlowMatchEulerDiscreteScheduler"
FLOW_MAP_CLASS = "FlowMapEulerDiscreteScheduler"

_SPACING = "a sigma spacing other than the (shifted) flow-matching linspace, not implemented"
_DYNAMIC = "resolution-dependent (dynamic) shifting, not implemented for these checkpoints"
_TERMINAL = "a last sigma stretched to a terminal value, not implemented"
_DDPM = "only UniPC's DDPM (beta) path reads it; the flow-sigma path we run never does"


@dataclass(frozen=True)
class SchedulerKeys:
    """One class's policy, and the diffusers default of each refused key (what a file without the key means)."""

    policy: KeyPolicy
    defaults: Mapping[str, Any]

    def check(self, cfg: Mapping[str, Any], where: str) -> None:
        """KeyPolicy.check, then refuse a missing key whose diffusers default we do not run."""
        self.policy.check(cfg, where)
        for key, default in self.defaults.items():
            refusal = self.policy.refused[key]
            if key not in cfg and not self.policy.accepts(key, default):
                raise CheckpointError(f"{where}: {key} is missing, and diffusers then runs {key}={default!r}, "
                                      f"which is not supported: {refusal.why}")


# Refused alike by both classes that have them (absent: diffusers' off).
_SHARED_REFUSED: dict[str, tuple[Any, Refusal]] = {
    "use_exponential_sigmas": (False, Refusal((False,), _SPACING)),
    "use_beta_sigmas": (False, Refusal((False,), _SPACING)),
    "use_dynamic_shifting": (False, Refusal((False,), _DYNAMIC)),
    "shift_terminal": (None, Refusal((None,), _TERMINAL)),
}
_UNIPC_REFUSED: dict[str, tuple[Any, Refusal]] = {
    "prediction_type": ("epsilon", Refusal(("flow_prediction",), "the flow-sigma UniPC we run predicts velocity")),
    "use_flow_sigmas": (False, Refusal((True,), "only the flow-matching sigma path is implemented")),
    "predict_x0": (True, Refusal((True,), "only the data-prediction (x0) UniPC update is implemented")),
    # diffusers itself maps the legacy names to bh2.
    "solver_type": ("bh2", Refusal(("bh2", "midpoint", "heun", "logrho"), "UniPC's bh1 update is not implemented")),
    "lower_order_final": (True, Refusal((True,), "without it the last order-2 step divides by an infinite step "
                                                 "size and returns inf")),
    "final_sigmas_type": ("zero", Refusal(("zero",), "the schedule we run ends at sigma 0")),
    "thresholding": (False, Refusal((False,), "dynamic thresholding is a pixel-space DDPM tool, not implemented")),
    "solver_p": (None, Refusal((None,), "a separate predictor solver, not implemented")),
    **_SHARED_REFUSED,
}
_EULER_REFUSED: dict[str, tuple[Any, Refusal]] = {
    "invert_sigmas": (False, Refusal((False,), "reversed sigmas (an editing schedule), not implemented")),
    "use_karras_sigmas": (False, Refusal((False,), _SPACING)),
    "stochastic_sampling": (False, Refusal((False,), "re-noising Euler steps, not implemented")),
    **_SHARED_REFUSED,
}


def _keys(read: set[str], harmless: Mapping[str, str], refused: Mapping[str, tuple[Any, Refusal]]) -> SchedulerKeys:
    # Every harmless key here is an argument of today's class, so every saved config has it: quiet (not recorded).
    return SchedulerKeys(KeyPolicy(frozenset(read), harmless, {k: r for k, (_, r) in refused.items()},
                                   quiet=frozenset(harmless)),
                         {k: d for k, (d, _) in refused.items()})


SCHEDULER_KEYS: dict[str, SchedulerKeys] = {
    # sigma_min / sigma_max: read only with use_karras_sigmas (the Karras range of Cosmos3's schedulers).
    UNIPC_CLASS: _keys(
        {"num_train_timesteps", "flow_shift", "solver_order", "disable_corrector", "use_karras_sigmas",
         "sigma_min", "sigma_max"},
        {**dict.fromkeys(("beta_start", "beta_end", "beta_schedule", "trained_betas", "rescale_betas_zero_snr",
                          "timestep_spacing", "steps_offset"), _DDPM),
         **dict.fromkeys(("dynamic_thresholding_ratio", "sample_max_value"),
                         "read only with thresholding, which is refused"),
         "time_shift_type": "read only with use_dynamic_shifting, which is refused"},
        _UNIPC_REFUSED),
    EULER_CLASS: _keys(
        {"num_train_timesteps", "shift"},
        dict.fromkeys(("base_shift", "max_shift", "base_image_seq_len", "max_image_seq_len", "time_shift_type"),
                      "read only with use_dynamic_shifting, which is refused"),
        _EULER_REFUSED),
    # AnyFlow's flow-map scheduler has no settings beyond these two.
    FLOW_MAP_CLASS: _keys({"num_train_timesteps", "shift"}, {}, {}),
}
UNIPC_POLICY = SCHEDULER_KEYS[UNIPC_CLASS].policy
EULER_POLICY = SCHEDULER_KEYS[EULER_CLASS].policy
FLOW_MAP_POLICY = SCHEDULER_KEYS[FLOW_MAP_CLASS].policy
