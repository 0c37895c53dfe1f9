"""A block whose weights are freed between uses, as --shard-weights leaves them (runtime.parallel.shard_weights),
gathered back from a kept copy instead of from other ranks: unit tests of code that reads a sharded block's weights
outside its forward (layers.sharded.resident)."""

from __future__ import annotations

import torch
from torch import nn

from vidloom.layers.sharded import mark_sharded


class FreedBlock:
    """Frees `block`'s parameters now (zero-byte storages, shapes kept) and marks it sharded; `gather` refills them."""

    def __init__(self, block: nn.Module) -> None:
        self.params = [p for p in block.parameters() if p.numel()]
        self.kept = [p.detach().clone() for p in self.params]
        self.gathers = 0
        self.free()
        mark_sharded(block, self)

    def gather(self) -> None:
        self.gathers += 1
        for param, kept in zip(self.params, self.kept):
            param.untyped_storage().resize_(kept.numel() * kept.element_size())
            with torch.no_grad():
                param.copy_(kept)

    def free(self) -> None:
        for param in self.params:
            param.untyped_storage().resize_(0)

    def resident(self) -> bool:
        return all(p.untyped_storage().nbytes() > 0 for p in self.params)
