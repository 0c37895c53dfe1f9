"""layers.sharded: work outside a sharded block's forward (a prompt's K/V prepared once per request) gathers that
block's whole weights for its duration, one block at a time, and leaves it freed."""

from __future__ import annotations

import torch
from torch import nn

from tests.helpers.freed_blocks import FreedBlock
from vidloom.layers.prompt_kv import prepare_prompt_kv
from vidloom.layers.sharded import each_resident, resident


class _Cross(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.k, self.v = nn.Linear(8, 8), nn.Linear(8, 8)

    def context_kv(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k(tokens).unflatten(-1, (2, 4)), self.v(tokens).unflatten(-1, (2, 4))


def test_prompt_kv_of_sharded_blocks_equals_the_whole_blocks_one_block_gathered_at_a_time():
    torch.manual_seed(0)
    blocks = [_Cross() for _ in range(3)]
    embeds = torch.randn(2, 5, 8)
    want = prepare_prompt_kv(blocks, lambda x: x * 2, embeds)
    shards = [FreedBlock(block) for block in blocks]
    seen = []

    def project(block: _Cross) -> int:
        seen.append([shard.resident() for shard in shards])
        return 0

    each_resident(blocks, project)
    assert seen == [[True, False, False], [False, True, False], [False, False, True]]
    got = prepare_prompt_kv(blocks, lambda x: x * 2, embeds)
    assert all(torch.equal(a, b) for a, b in zip((*want.keys, *want.values), (*got.keys, *got.values)))
    assert [shard.gathers for shard in shards] == [2, 2, 2] and not any(shard.resident() for shard in shards)


def test_a_failure_inside_frees_the_block_again_and_unsharded_modules_are_left_alone():
    block, plain = _Cross(), _Cross()
    shard = FreedBlock(block)
    try:
        with resident(block.k):  # a submodule finds its block's shard
            assert shard.resident()
            raise ValueError("boom")
    except ValueError:
        pass
    assert not shard.resident()
    with resident(plain):
        assert plain.k.weight.untyped_storage().nbytes() > 0
