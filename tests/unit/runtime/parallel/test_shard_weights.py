"""--shard-weights with ranks as threads: each rank of the sp group keeps 1/sp of every block's weights between
forwards and gathers them around each block; the output equals the unsharded sp run bit for bit (the gather
copies values), parameters keep their shapes, and the resident bytes shrink by the blocks' share."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from tests.helpers.thread_comm import run_ranks, thread_group
from tests.unit.runtime.parallel.test_joint_sp import CASES as JOINT_CASES
from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import DeployError
from vidloom.core.parallel import ParallelPlan
from vidloom.families.sana_wm.transformer import SanaWMTransformer
from vidloom.layers import fused_linear
from vidloom.models.wan.transformer import WanTransformer
from vidloom.models.wan.transformer_config import WanTransformerConfig
from vidloom.runtime.parallel.shard_weights import resident_weight_bytes, shard_blocks
from vidloom.runtime.parallel.ulysses import apply_sp

TINY = WanTransformerConfig(
    num_attention_heads=4, attention_head_dim=12, in_channels=4, out_channels=4, text_dim=16,
    freq_dim=16, ffn_dim=32, num_layers=3,
)


def _bytes(module: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


@pytest.mark.parametrize("size", [2, 3])
def test_sharded_blocks_give_the_unsharded_output_and_hold_their_share(size):
    torch.manual_seed(0)
    model = WanTransformer(TINY).eval()
    latents = torch.randn(1, 4, 2, 4, 6)  # patch grid 2 x 2 x 3 = 12 tokens
    timestep, text = torch.tensor([700.0]), torch.randn(1, 5, 16)
    whole, blocks = _bytes(model), sum(_bytes(b) for b in model.compile_units())

    def rank(comm):
        plain, sharded = copy.deepcopy(model), copy.deepcopy(model)
        apply_sp(plain, comm)
        apply_sp(sharded, comm)
        handles = shard_blocks(sharded.compile_units(), comm)
        held = resident_weight_bytes(sharded, handles)
        shapes = [p.shape for p in sharded.parameters()] == [p.shape for p in model.parameters()]
        with torch.inference_mode():
            outs = [plain(latents, timestep, text), sharded(latents, timestep, text), sharded(latents, timestep, text)]
        return outs, held, shapes, resident_weight_bytes(sharded, handles)

    for (plain, once, twice), held, shapes, after in run_ranks(thread_group(size), rank):
        assert torch.equal(once, plain) and torch.equal(twice, plain)
        assert shapes and after == held  # freed again after each block: nothing stays gathered
        # Every weight outside the blocks, whole, plus the blocks' share: float32 blocks are one flat buffer each,
        # padded by fewer than `size` elements.
        padding = held - (whole - blocks) - blocks / size
        assert 0 <= padding < TINY.num_layers * size * 4, (held, whole, blocks)


def test_shard_weights_needs_sp_and_refuses_what_cannot_follow_it():
    with pytest.raises(DeployError, match="needs --sp 2 or more"):
        ParallelPlan(cfg=2, shard_weights=True)
    plan = ParallelPlan(sp=2, shard_weights=True)
    assert "sharded weights" in plan.describe()
    for flags, named in ((dict(compile=True), "--compile"), (dict(fp8_weights=True), "--fp8"),
                         (dict(offload_idle_expert=True), "--offload-idle-expert")):
        with pytest.raises(DeployError, match=f"--shard-weights gathers .* which {named}"):
            DeployConfig(devices=2, parallel=plan, **flags)
    DeployConfig(devices=2, parallel=plan)


def _sana_wm_mlp() -> tuple[torch.nn.Module, tuple]:
    from tests.unit.families.test_sana_wm_sp import CONFIG, _inputs

    model = SanaWMTransformer(dataclasses.replace(CONFIG, ffn_type="mlp"))  # its block FFN: the tanh-GELU MLP
    with torch.no_grad():  # zero-initialised tables and gates get values, so every path moves the output
        for p in model.parameters():
            p.copy_(0.3 * torch.randn(p.shape))
    return model, _inputs(4)


# Families whose sharded blocks run layers.fused_linear's Linear + tanh-GELU (Wan's is TINY above).
FUSED_GELU = {"hunyuan15": lambda: JOINT_CASES["hunyuan15"](5), "sana_wm_mlp": _sana_wm_mlp}


@pytest.mark.parametrize("family", list(FUSED_GELU))
def test_sharded_blocks_keep_the_fused_gelu_and_the_unsharded_bits(family, monkeypatch):
    torch.manual_seed(0)
    model, inputs = FUSED_GELU[family]()
    model.eval()
    taken: list[bool] = []  # per up-projection call on rows (a rank may hold no rows of one stream)
    applies = fused_linear.fused_applies

    def spy(linear, x) -> bool:
        if x.numel():
            taken.append(applies(linear, x))
        return applies(linear, x)

    monkeypatch.setattr(fused_linear, "fused_applies", spy)

    def rank(comm):
        plain, sharded = copy.deepcopy(model), copy.deepcopy(model)
        apply_sp(plain, comm)
        apply_sp(sharded, comm)
        shard_blocks(sharded.compile_units(), comm)
        with torch.inference_mode():
            return plain(*inputs), sharded(*inputs)

    for plain, sharded in run_ranks(thread_group(2), rank):
        assert torch.equal(sharded, plain)
    # Every up-projection on rows fused, the gathered blocks' too: two ranks x two runs x at least one per block.
    assert len(taken) >= 2 * 2 * len(model.compile_units()) and all(taken)
