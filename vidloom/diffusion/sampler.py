"""The sampler interface, the scheduler config read from a checkpoint, and the sampler registry."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, Protocol, TypeVar, runtime_checkable

import numpy as np
import torch

from vidloom.core import plugin
from vidloom.core.errors import CheckpointError
from vidloom.diffusion.scheduler_keys import EULER_CLASS, FLOW_MAP_CLASS, SCHEDULER_KEYS, UNIPC_CLASS
from vidloom.loading.diffusers_dir import DiffusersDir

# diffusers key -> SamplerConfig field, per scheduler class (scheduler_keys.py classifies every other key).
_UNIPC_FIELDS = {
    "num_train_timesteps": "num_train_timesteps",
    "flow_shift": "shift",
    "solver_order": "solver_order",
    "disable_corrector": "disable_corrector",
}
_EULER_FIELDS = {"num_train_timesteps": "num_train_timesteps", "shift": "shift"}
_FIELDS = {UNIPC_CLASS: _UNIPC_FIELDS, EULER_CLASS: _EULER_FIELDS, FLOW_MAP_CLASS: _EULER_FIELDS}
# Keys whose presence means a UniPC config when `_class_name` is missing.
_UNIPC_ONLY_KEYS = frozenset({"flow_shift", "use_flow_sigmas", "prediction_type", "solver_order"})


def known_scheduler_keys(class_name: str) -> frozenset[str]:
    """Every scheduler_config.json key SamplerConfig.from_diffusers classifies for `class_name` (others are
    refused)."""
    return SCHEDULER_KEYS[class_name].policy.known


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _karras_range(cfg: Mapping[str, Any]) -> tuple[float, float]:
    """(sigma_min, sigma_max) of a Karras UniPC config; both must be given.

    Without them diffusers takes the range from the DDPM betas (beta_start, beta_end, ...), a
    path no released flow checkpoint uses, so it is refused rather than half-supported.
    """
    bounds = []
    for key in ("sigma_min", "sigma_max"):
        value = cfg.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise CheckpointError(f"{key}: {value!r}; use_karras_sigmas needs sigma_min and sigma_max as numbers "
                             "(the range from DDPM betas is not supported)")
        bounds.append(float(value))
    return bounds[0], bounds[1]


@dataclass(frozen=True)
class SamplerConfig:
    """What a checkpoint's scheduler_config.json says about sampling, reduced to what we read."""

    num_train_timesteps: int = 1000
    shift: float = 1.0  # diffusers "flow_shift" (UniPC) or "shift" (FlowMatchEuler, FlowMapEuler)
    dmd_timesteps: tuple[float, ...] = ()  # dmd only: the distilled step list (from the card's RecipeSpec)
    solver_order: int = 2  # UniPC only
    disable_corrector: frozenset[int] = frozenset()  # UniPC only: steps whose corrector is skipped
    # UniPC only: (sigma_min, sigma_max) of a Karras schedule mapped onto flow sigmas (diffusers'
    # use_karras_sigmas with use_flow_sigmas); the flow shift does not apply to it. None: shifted linspace.
    karras_sigmas: tuple[float, float] | None = None
    # UniPC only: start the shifted linspace at 1 - 1/num_train_timesteps and end it at 0 (before the
    # final step), as Cosmos3OmniPipeline's use_native_flow_schedule passes the scheduler its sigmas.
    native_flow_schedule: bool = False

    def __post_init__(self) -> None:
        if not _is_int(self.num_train_timesteps) or self.num_train_timesteps < 1:
            raise ValueError(
                f"num_train_timesteps must be an int >= 1, got {self.num_train_timesteps!r}"
            )
        if not float(self.shift) > 0.0:
            raise ValueError(f"shift must be > 0, got {self.shift!r}")
        if not _is_int(self.solver_order) or self.solver_order < 1:
            raise ValueError(f"solver_order must be an int >= 1, got {self.solver_order!r}")
        # Normalise JSON forms (int shift, list of indices) so equal configs compare equal.
        object.__setattr__(self, "shift", float(self.shift))
        object.__setattr__(self, "dmd_timesteps", tuple(float(t) for t in self.dmd_timesteps))
        corrector_off = frozenset(int(i) for i in self.disable_corrector)
        object.__setattr__(self, "disable_corrector", corrector_off)
        if self.karras_sigmas is not None:
            low, high = (float(v) for v in self.karras_sigmas)
            if not 0.0 < low < high:
                raise ValueError(f"sigma_min, sigma_max must satisfy 0 < sigma_min < sigma_max, got {low}, {high}")
            object.__setattr__(self, "karras_sigmas", (low, high))

    @property
    def uses_shift(self) -> bool:
        """Whether `shift` moves the schedule (a Karras schedule ignores it, as diffusers' does)."""
        return self.karras_sigmas is None

    @staticmethod
    def config_keys(class_name: str) -> frozenset[str]:
        """Every scheduler_config.json key from_diffusers classifies for `class_name` (scheduler_keys.py)."""
        return known_scheduler_keys(class_name)

    @classmethod
    def from_diffusers(cls, cfg: Mapping[str, Any]) -> SamplerConfig:
        """Read a diffusers UniPC, FlowMatchEuler or FlowMapEuler scheduler config; CheckpointError for a key
        or value (a missing key's diffusers default included) we do not run."""
        class_name = cfg.get("_class_name")
        if class_name is None:
            class_name = UNIPC_CLASS if _UNIPC_ONLY_KEYS & cfg.keys() else EULER_CLASS
        if class_name not in SCHEDULER_KEYS:
            raise CheckpointError(f"_class_name: {class_name!r} is not supported (expected one of "
                                  f"{', '.join(SCHEDULER_KEYS)})")
        SCHEDULER_KEYS[class_name].check(cfg, class_name)
        mapped = _FIELDS[class_name]
        fields = {ours: cfg[theirs] for theirs, ours in mapped.items() if theirs in cfg}
        if class_name == UNIPC_CLASS and cfg.get("use_karras_sigmas") is True:
            fields["karras_sigmas"] = _karras_range(cfg)
        return cls(**fields)

    def with_shift(self, shift: float) -> SamplerConfig:
        """The same config with another flow shift (e.g. a request's flow_shift override).

        A Karras schedule has no shift to change: another value is a ValueError rather than a no-op
        (families check this at their request boundary; this is the net under all of them).
        """
        if not self.uses_shift and float(shift) != self.shift:
            raise ValueError(f"flow_shift {shift} does not apply: this scheduler uses Karras sigmas "
                             f"(use_karras_sigmas), which take no shift")
        return dataclasses.replace(self, shift=shift)


def load_sampler_config(ckpt: DiffusersDir) -> SamplerConfig:
    """The checkpoint's scheduler settings; an unreadable scheduler_config.json is a CheckpointError."""
    return ckpt.parse_component("scheduler", SamplerConfig.from_diffusers, "scheduler_config.json")


@dataclass(frozen=True)
class Schedule:
    """The noise levels of one sampling run."""

    timesteps: torch.Tensor  # exactly what the model is called with, in diffusers' dtype
    sigmas: torch.Tensor  # float32 (flow-map Euler: float64), len(timesteps) + 1, ending at 0

    def __post_init__(self) -> None:
        if self.sigmas.shape != (self.timesteps.shape[0] + 1,):
            raise ValueError(
                f"sigmas must have len(timesteps) + 1 = {self.timesteps.shape[0] + 1} entries, "
                f"got shape {tuple(self.sigmas.shape)}"
            )

    @classmethod
    def from_sigmas(cls, sigmas: torch.Tensor, num_train_timesteps: int) -> Schedule:
        """The schedule through noise levels `sigmas` (high to low, no final zero), ending at sigma 0.

        The model sees timesteps sigma * num_train_timesteps in the sigmas' own dtype (no
        rounding to integers), as diffusers' flow-matching Euler schedulers give them.
        """
        return cls(timesteps=sigmas * num_train_timesteps, sigmas=torch.cat([sigmas, sigmas.new_zeros(1)]))

    @property
    def num_steps(self) -> int:
        return int(self.timesteps.shape[0])


@dataclass(frozen=True)
class ScheduleState:
    """The state of a one-step sampler (Euler, flow-map Euler): no history, only the request's schedule."""

    schedule: Schedule


@runtime_checkable
class Sampler(Protocol):
    """A stateless solver; everything a request accumulates lives in the object init_state returns."""

    @property
    def name(self) -> str: ...

    @property
    def config(self) -> SamplerConfig: ...

    def schedule(self, num_steps: int) -> Schedule: ...

    def init_state(self, schedule: Schedule, start: int = 0, generator: torch.Generator | None = None) -> Any:
        """Fresh per-request state whose first step is `start` (> 0 resumes a partly noised sample);
        stochastic samplers draw from `generator` (the request's, after its initial noise)."""
        ...

    def step(
        self, state: Any, index: int, model_output: torch.Tensor, sample: torch.Tensor
    ) -> torch.Tensor:
        """Advance `sample` from sigmas[index] to sigmas[index + 1]; mutates only `state`."""
        ...


_Array = TypeVar("_Array", np.ndarray, torch.Tensor)


def shift_sigmas(sigmas: _Array, shift: float) -> _Array:
    """Timestep shift of Esser et al. 2024 (SD3, arXiv:2403.03206): s' = a*s / (1 + (a-1)*s).

    Spends more steps at high noise for large a. Kept in this operation order so the
    float rounding equals diffusers' in both numpy float64 and torch float32.
    """
    return shift * sigmas / (1 + (shift - 1) * sigmas)


def check_num_steps(num_steps: int) -> None:
    if not _is_int(num_steps) or num_steps < 1:
        raise ValueError(f"num_steps must be an int >= 1, got {num_steps!r}")


@dataclass(frozen=True)
class ConfiguredSampler:
    """Base of the registered samplers: built from the checkpoint's scheduler config; `schedule` checks the step
    count, then the subclass's `_schedule` lays the steps out."""

    config: SamplerConfig
    name: ClassVar[str]

    def schedule(self, num_steps: int) -> Schedule:
        check_num_steps(num_steps)
        return self._schedule(num_steps)

    def _schedule(self, num_steps: int) -> Schedule:
        raise NotImplementedError


def check_index(schedule: Schedule, index: int) -> None:
    if not 0 <= index < schedule.num_steps:
        raise ValueError(f"step index {index} is outside the schedule's {schedule.num_steps} steps")


# Explicit table rather than import-time registration, so the names are greppable and
# a sampler's module (and its dependencies) load only when a request asks for it.
SAMPLERS: dict[str, str] = {
    "dmd": "vidloom.diffusion.dmd:DMDSampler",
    "euler": "vidloom.diffusion.flow_euler:FlowEulerSampler",
    "unipc": "vidloom.diffusion.unipc:UniPCSampler",
    "flow_map_euler": "vidloom.diffusion.flow_map_euler:FlowMapEulerSampler",
}


def make_sampler(name: str, config: SamplerConfig) -> Sampler:
    """Build the sampler registered as `name`; unknown names raise ValueError listing the known ones."""
    target = SAMPLERS.get(name)
    if target is None:
        raise ValueError(f"unknown sampler {name!r}; known samplers: {', '.join(sorted(SAMPLERS))}")
    sampler = plugin.resolve(target)(config)
    if not isinstance(sampler, Sampler):
        raise TypeError(f"{target} does not implement the Sampler protocol")
    return sampler
