"""Runtime features a card's family honours, declared on the card and checked once at load.

A feature is one or more DeployConfig fields that only mean something together (compile and its backend).
A deployment that turns on a feature its card does not declare is refused at load, naming the feature, its
flags, the model and the family, with the card's reason where it gives one: nothing is accepted and ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import DeployError, InvalidCard


@dataclass(frozen=True)
class Feature:
    """A deploy feature: the DeployConfig fields it covers and the CLI flags that set them. A feature of no fields is
    a server policy (batching): never refused at load; a run of a family without it says it ran without it."""

    fields: tuple[str, ...]
    flags: tuple[str, ...]


# Every DeployConfig field belongs to exactly one feature (tests/unit/core/test_capabilities.py checks it), so a
# new field cannot reach a family that never declared it. Keys name the feature by its main field.
FEATURES: Mapping[str, Feature] = MappingProxyType({
    "fp8_weights": Feature(("fp8_weights",), ("--fp8",)),
    "compile": Feature(("compile", "compile_backend"), ("--compile", "--compile-backend")),
    "warmup_shapes": Feature(("warmup_shapes",), ("--warmup",)),
    "offload_text_encoder": Feature(("offload_text_encoder",), ("--offload-text-encoder",)),
    "prompt_cache_size": Feature(("prompt_cache_size",), ("--prompt-cache",)),
    "vae_tile": Feature(("vae_tile", "vae_tile_stride"), ("--vae-tile", "--vae-tile-stride")),
    "attention_backend": Feature(("attention_backend",), ("--attention-backend",)),
    "cfg_mode": Feature(("cfg_mode",), ("--cfg-mode",)),
    "step_cache": Feature(("step_cache", "step_cache_threshold", "step_cache_fn", "step_cache_bn", "step_cache_warmup",
                           "step_cache_max_cached", "step_cache_max_continuous", "step_cache_taylorseer",
                           "step_cache_mask"),
                          ("--step-cache", "--step-cache-threshold", "--step-cache-fn", "--step-cache-bn",
                           "--step-cache-warmup", "--step-cache-max-cached", "--step-cache-max-continuous",
                           "--step-cache-taylorseer", "--step-cache-mask")),
    "cuda_graphs": Feature(("cuda_graphs",), ("--cuda-graphs",)),
    "kv_cache_budget_bytes": Feature(("kv_cache_budget_bytes",), ("--kv-cache-budget-mb",)),
    "kv_pool_tokens": Feature(("kv_pool_tokens",), ("--kv-pool-tokens",)),
    "kv_session_ttl_s": Feature(("kv_session_ttl_s",), ("--kv-session-ttl",)),
    "offload_idle_expert": Feature(("offload_idle_expert",), ("--offload-idle-expert",)),
    "two_stage": Feature(("two_stage", "upsampler", "stage2_lora"), ("--two-stage", "--upsampler", "--stage2-lora")),
    # Several devices, one process each, with the tokens sharded over them (--sp); --cfg-parallel is its own feature
    # (only families with classic CFG take it). A field "a.b" is field b of DeployConfig.a.
    "devices": Feature(("devices", "parallel.sp", "parallel.shard_weights"), ("--devices", "--sp", "--shard-weights")),
    "cfg_parallel": Feature(("parallel.cfg",), ("--cfg-parallel",)),
    # One rank of the plan holds the text encoder(s) and broadcasts the encoded prompt (families with a separate
    # encoder whose prompt encoding is one program node).
    "text_encoder_rank": Feature(("parallel.text_encoder_rank",), ("--text-encoder-rank",)),
    "components": Feature(("components",), ("--component",)),
    # Requests' denoise steps sharing one forward (runtime.batching); elsewhere each runs alone, reported per run.
    "batching": Feature((), ("--policy batch",)),
})


@dataclass(frozen=True)
class Capabilities:
    """The features (FEATURES keys) a card's loader, program and runtime honour; every other one is refused.

    `why_not` gives the reason a feature is refused (shown in the error); it may name only refused features.
    """

    supported: frozenset[str]
    why_not: Mapping[str, str] = field(default_factory=dict)
    lora_why_not: str | None = None
    """Why this kind refuses LoRA adapters although its family takes them (Family.lora); None: it takes them.
    Read where an adapter is attached (lora.registry.attach_registry) and by the capability table."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "supported", frozenset(self.supported))
        object.__setattr__(self, "why_not", MappingProxyType(dict(self.why_not)))
        unknown = sorted((self.supported | set(self.why_not)) - set(FEATURES))
        if unknown:
            raise InvalidCard(f"capabilities name unknown features {unknown}; known: {', '.join(FEATURES)}")
        both = sorted(self.supported & set(self.why_not))
        if both:
            raise InvalidCard(f"capabilities both support and explain refusing {both}")

    def without(self, reasons: Mapping[str, str]) -> "Capabilities":
        """These capabilities less the features in `reasons` (feature -> why this checkpoint cannot take it)."""
        return Capabilities(self.supported - set(reasons), {**self.why_not, **reasons}, self.lora_why_not)

    def plus(self, *names: str) -> "Capabilities":
        """These capabilities with `names` supported too (their refusal reasons dropped): a kind of checkpoint that
        honours what its family's base card refuses."""
        return Capabilities(self.supported | set(names), {k: v for k, v in self.why_not.items() if k not in names},
                            self.lora_why_not)

    def why(self, name: str) -> str:
        """Why feature `name` is refused: the card's reason, or that nothing declared it."""
        return self.why_not.get(name, "not wired for this family")

    def refuse_unsupported(self, deploy: DeployConfig, model_id: str, family: str) -> None:
        """Fail naming every feature `deploy` turns on (a field off its default) that is not supported."""
        refused = [name for name in enabled_features(deploy) if name not in self.supported]
        if not refused:
            return
        parts = [f"{name} ({', '.join(FEATURES[name].flags)}): {self.why(name)}" for name in refused]
        raise DeployError(f"{model_id} ({family}) does not support {'; '.join(parts)}; drop the option(s)")


def enabled_features(deploy: DeployConfig) -> list[str]:
    """The features `deploy` turns on: those with any field away from DeployConfig's default."""
    default = DeployConfig()
    return [name for name, feature in FEATURES.items()
            if any(deploy_value(deploy, f) != deploy_value(default, f) for f in feature.fields)]


def deploy_value(deploy: DeployConfig, field_path: str) -> object:
    """The value of a Feature field: "cfg_mode" is deploy.cfg_mode, "parallel.cfg" deploy.parallel.cfg."""
    value: object = deploy
    for part in field_path.split("."):
        value = getattr(value, part)
    return value
