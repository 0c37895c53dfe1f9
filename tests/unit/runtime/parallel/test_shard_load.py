"""--shard-weights at load: a denoiser's blocks never sit whole on the rank's device.

The family loaders build every module through precision.materialize (and build_component); inside
loading.host_blocks.blocks_on_host() the denoiser's blocks are allocated and filled on the host, and shard_blocks moves
only this rank's slice of each to the device. On a CPU-only machine the host is the device, so the placement is
checked with the meta device as the target: the real loaders of four families (SANA-WM's blocks have buffers too) fill the blocks on the host and put
everything else on "the device"; after sharding no block weight is left on the host and the device holds the slices.
Parity is checked on the CPU with ranks as threads: the held-then-sharded denoiser gives the unsharded output exactly,
and while it runs at most one block is gathered at a time."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch

from tests.helpers import ltx2_checkpoints, sana_wm_checkpoints, stable_audio_checkpoints, wan_checkpoints
from tests.helpers.thread_comm import run_ranks, thread_group
from vidloom import registry
from vidloom.core.deploy import DeployConfig
from vidloom.core.parallel import ParallelPlan
from vidloom.loading.host_blocks import blocks_on_host
from vidloom.runtime.parallel.shard_weights import shard_blocks
from vidloom.runtime.parallel.ulysses import apply_sp

SHARDED = DeployConfig(devices=2, parallel=ParallelPlan(sp=2, shard_weights=True))
WRITERS = {
    "wan": lambda folder: wan_checkpoints.write_tiny_wan(folder, wan_checkpoints.TINY_A),
    "ltx2": lambda folder: ltx2_checkpoints.write_tiny_ltx2(folder, ltx2_checkpoints.TINY_SPLIT),
    "sana_wm": lambda folder: sana_wm_checkpoints.write_tiny_sana_wm(folder, sana_wm_checkpoints.SANA_WM_A),
    "stable_audio": lambda folder: stable_audio_checkpoints.write_tiny_stable_audio(
        folder, stable_audio_checkpoints.TINY_STEREO),
}


def _load(folder: Path, device: torch.device, held: bool):
    card = registry.resolve_card(str(folder))
    if not held:
        return registry.load_instance(card, folder, device, torch.float32, DeployConfig()), None
    with blocks_on_host() as host:
        return registry.load_instance(card, folder, device, torch.float32, SHARDED), host


def _block_params(denoiser: torch.nn.Module) -> set[int]:
    return {id(p) for block in denoiser.compile_units() for p in block.parameters()}


@pytest.mark.parametrize("family", sorted(WRITERS))
def test_the_loaders_fill_the_blocks_on_the_host_and_only_slices_reach_the_device(family, tmp_path):
    folder = WRITERS[family](tmp_path)
    device = torch.device("meta")  # stands in for an accelerator: nothing placed there takes host memory
    instance, host = _load(folder, device, held=True)
    layout = registry.token_layout(instance.card, folder)
    denoisers = [instance[name] for name in layout.denoisers if name in instance.components]
    blocks = set().union(*map(_block_params, denoisers))
    on_host = [p for name, value in instance.components.items() if isinstance(value, torch.nn.Module)
               for p in value.parameters() if p.device.type == "cpu"]
    assert blocks and {id(p) for p in on_host} == blocks  # the blocks, filled on the host; nothing else
    assert {b for d in denoisers for b in map(id, d.compile_units())} <= {id(b) for b in host.blocks}
    block_bytes = sum(p.numel() * p.element_size() for d in denoisers for p in d.parameters() if id(p) in blocks)

    def rank(comm):
        return [shard_blocks(d.compile_units(), comm, device) for d in denoisers] if comm.rank == 0 else None

    handles = [h for per_denoiser in run_ranks(thread_group(2), rank)[0] for h in per_denoiser]
    host.release(device, keep={id(h.block) for h in handles})
    for denoiser in denoisers:
        assert all(buffer.device == device for buffer in denoiser.buffers())  # release moved the blocks' buffers
        for param in denoiser.parameters():
            assert param.device == device and param.numel() > 0  # on the device, shapes kept
            if id(param) in blocks:
                assert param.untyped_storage().nbytes() == 0  # freed until its block runs
    slices = sum(g.shard.numel() * g.shard.element_size() for h in handles for g in h.groups)
    assert all(g.shard.device == device for h in handles for g in h.groups)
    assert block_bytes / 2 <= slices < block_bytes / 2 + 2 * 4 * len(handles) * 2  # half, plus padding


def test_held_blocks_give_the_unsharded_output_one_gathered_block_at_a_time():
    folder = wan_checkpoints.write_tiny_wan(Path(tempfile.mkdtemp()), wan_checkpoints.TINY_A)
    cpu = torch.device("cpu")
    plain, _ = _load(folder, cpu, held=False)
    torch.manual_seed(0)
    latents, timestep, text = torch.randn(1, 4, 2, 4, 6), torch.tensor([700.0]), torch.randn(1, 5, 32)

    loaded = [_load(folder, cpu, held=True) for _ in range(2)]  # before the ranks start: their barrier has a timeout

    def rank(comm):
        instance, host = loaded[comm.rank]
        denoiser = instance["transformer"]
        apply_sp(denoiser, comm)
        handles = shard_blocks(denoiser.compile_units(), comm, cpu)
        host.release(cpu, keep={id(h.block) for h in handles})
        gathered: list[int] = []
        for block in denoiser.compile_units():
            block.register_forward_pre_hook(lambda *_: gathered.append(sum(
                p.untyped_storage().nbytes() for b in denoiser.compile_units() for p in b.parameters())))
        with torch.inference_mode():
            return denoiser(latents, timestep, text), gathered, max(
                sum(p.numel() * p.element_size() for p in b.parameters()) for b in denoiser.compile_units())

    with torch.inference_mode():
        expected = plain["transformer"](latents, timestep, text)
    for out, gathered, one_block in run_ranks(thread_group(2), rank):
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
        assert gathered and max(gathered) <= one_block  # only the block about to run is whole
