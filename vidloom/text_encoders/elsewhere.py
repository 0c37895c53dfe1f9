"""What a rank without the text encoder holds in its place (--text-encoder-rank): a marker that fails if used."""

from __future__ import annotations

from typing import Any, Callable, TypeVar

from vidloom.core.deploy import DeployConfig

T = TypeVar("T")


class EncoderElsewhere:
    """Stands in an instance's component table for a text encoder that another rank holds and runs.

    The program of such a rank never calls it (runtime.parallel.prompt_rank replaces its prompt nodes with a
    receive), so any attribute read is a wiring bug: it fails naming the component and the rank that holds it.
    Not an nn.Module, so code that walks the instance's modules (weights, devices, adapters) passes it by.
    """

    def __init__(self, component: str, owner_rank: int) -> None:
        self.component = component
        self.owner_rank = owner_rank

    def __getattr__(self, name: str) -> Any:
        # Only reached for attributes the instance does not have (component and owner_rank are set in __init__).
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(f"{self.component} is held by rank {self.owner_rank} (parallel.text_encoder_rank); "
                             f"this rank receives encoded prompts and cannot read .{name}")

    def __repr__(self) -> str:
        return f"EncoderElsewhere({self.component!r}, owner_rank={self.owner_rank})"


def encoder_or_elsewhere(load: Callable[[], T], deploy: DeployConfig, here: bool,
                         component: str = "text_encoder") -> T | EncoderElsewhere:
    """`load()` where prompts are encoded: every rank without --text-encoder-rank, else the rank it names (the loader
    is told `here`); on the other ranks an EncoderElsewhere, so their encoder weights are never read."""
    owner = deploy.parallel.text_encoder_rank
    if here or owner is None:
        return load()
    return EncoderElsewhere(component, owner)
