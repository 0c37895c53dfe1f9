"""BlockStack: the denoiser-contract members of a DiT whose blocks are one `nn.ModuleList` named `blocks`."""

from __future__ import annotations

from torch import nn


class BlockStack:
    """Mixin for a DiT module with `self.blocks`: the block count step caches index (core.denoiser.StagedDenoiser)
    and the units `--compile` wraps, one graph per shape bucket (core.denoiser.CompileUnits)."""

    blocks: nn.ModuleList

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    def compile_units(self) -> tuple[nn.Module, ...]:
        """The blocks, in order (structurally identical, so one compiled graph per shape bucket serves all)."""
        return tuple(self.blocks)
