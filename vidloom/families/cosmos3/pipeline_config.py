"""The pipeline-level settings of a Cosmos3 Omni folder's model_index.json, read strictly.

Cosmos3OmniPipeline registers three settings next to its components (`enable_safety_checker`,
`default_use_system_prompt`, `use_native_flow_schedule`); each is read here and honoured, and any
other key is a CheckpointError naming it, so a setting a newer checkpoint adds is never silently
sampled differently. The component entries ([library, class]) are checked too: a folder whose VAE is
not the Wan VAE, say, fails here, naming the component, rather than deep in weight loading.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from vidloom.core.errors import CheckpointError
from vidloom.loading.config_keys import read_key, strict_bool
from vidloom.loading.key_policy import KeyPolicy

# component -> the [library, class] entries we load it as; None: the component may be absent ([null, null]).
COMPONENT_CLASSES: dict[str, tuple[tuple[str, str] | None, ...]] = {
    "transformer": (("diffusers", "Cosmos3OmniTransformer"),),
    # A chat-only folder may leave out the generation components (cards.py decides from the folders).
    "vae": (("diffusers", "AutoencoderKLWan"), None),
    "scheduler": (("diffusers", "UniPCMultistepScheduler"), None),
    "sound_tokenizer": (("diffusers", "Cosmos3AVAEAudioTokenizer"), None),
    # The Cosmos guardrail is a separate package (cosmos_guardrail); see `safety_checker` below.
    "safety_checker": (("cosmos_guardrail", "CosmosSafetyChecker"), None),
}
TOKENIZER_LIBRARY = "transformers"  # text_tokenizer: any transformers tokenizer class (AutoTokenizer reads it)
SETTINGS = ("enable_safety_checker", "default_use_system_prompt", "use_native_flow_schedule")
INDEX_KEYS = frozenset({*SETTINGS, *COMPONENT_CLASSES, "text_tokenizer"})  # every model_index.json key we read
SAFETY_NOTE = ("model_index.json enables the Cosmos guardrail (enable_safety_checker); vidloom does not run "
               "cosmos_guardrail's CosmosSafetyChecker, so outputs are not screened or face-blurred")


@dataclass(frozen=True)
class Cosmos3PipelineConfig:
    """Cosmos3OmniPipeline's registered settings (its __init__ defaults where a key is absent)."""

    # The checkpoint asks for the guardrail; we cannot run it, and say so in the card's notes.
    safety_checker: bool = True
    # Generation prompts start with the image/video system turn (tokenize_prompt's use_system_prompt default).
    use_system_prompt: bool = True
    # Flow sigmas from linspace(1 - 1/N, 0) instead of the scheduler's own linspace(1, 1/N).
    native_flow_schedule: bool = False

    @classmethod
    def from_index(cls, index: Mapping[str, Any], where: str) -> Cosmos3PipelineConfig:
        """Read `index` (model_index.json); an unknown key or an unexpected component class names itself."""
        KeyPolicy(INDEX_KEYS).check(index, where)
        for name, accepted in COMPONENT_CLASSES.items():
            _check_component(index, name, accepted, where)
        tokenizer = index.get("text_tokenizer")
        if not (isinstance(tokenizer, list) and len(tokenizer) == 2 and tokenizer[0] == TOKENIZER_LIBRARY):
            raise CheckpointError(f"{where}: text_tokenizer is {tokenizer!r}, expected [{TOKENIZER_LIBRARY!r}, CLASS]")
        return cls(
            safety_checker=read_key(index, "enable_safety_checker", True, strict_bool, where),
            use_system_prompt=read_key(index, "default_use_system_prompt", True, strict_bool, where),
            native_flow_schedule=read_key(index, "use_native_flow_schedule", False, strict_bool, where),
        )

    @property
    def notes(self) -> tuple[str, ...]:
        """What a user should know about this folder's settings that the outputs do not show."""
        return (SAFETY_NOTE,) if self.safety_checker else ()


def _check_component(index: Mapping[str, Any], name: str, accepted: tuple[tuple[str, str] | None, ...],
                     where: str) -> None:
    entry = index.get(name)
    pair = None if entry is None or entry == [None, None] else tuple(entry) if isinstance(entry, list) else entry
    if pair not in accepted:
        shown = ", ".join("[null, null]" if a is None else f"[{a[0]!r}, {a[1]!r}]" for a in accepted)
        raise CheckpointError(f"{where}: component {name} is {entry!r}; this runtime loads it as {shown}")

