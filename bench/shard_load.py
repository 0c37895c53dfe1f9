"""--shard-weights at load: the bytes each rank puts on its device, counted, with and without holding the
denoiser's blocks on the host (loading.host_blocks).

The target device is the meta device, standing in for an accelerator on a machine that has none: the real loader
runs (the checkpoint is read, the blocks are filled on the host) and every tensor it places on "the device" is
counted by its size, without taking host memory. Today's path before this change (no hold) puts the whole instance
there; the held path puts everything but the blocks there, then shard_blocks moves one slice per block. Sharding today's
whole instance is not counted (meta tensors share no storage to check), so its peak is given as the whole load, a
lower bound. The peak while sharding the held blocks adds, per block, at most its largest parameter for an instant (the empty device storage is sized by
set_ and emptied at once). The host side is read from /proc (RssAnon, this process), with its peak over the load.

    python bench/shard_load.py [--size mid] [--sp 2]
"""

from __future__ import annotations

import argparse
import os
import threading
import time
import types
from typing import Any

import torch

from checkpoints import SIZES, ensure_checkpoint
from report import environment, print_table, write_json
from vidloom import registry
from vidloom.core.deploy import DeployConfig
from vidloom.core.parallel import ParallelPlan
from vidloom.loading.host_blocks import blocks_on_host
from vidloom.runtime.parallel.shard_weights import shard_blocks

MIB = 2 ** 20
META = torch.device("meta")


def device_bytes(components: dict[str, Any], device: torch.device = META) -> int:
    """Bytes of the parameters and buffers of the instance's modules that sit on `device`."""
    seen: dict[int, int] = {}
    for value in components.values():
        if isinstance(value, torch.nn.Module):
            for tensor in (*value.parameters(), *value.buffers()):
                if tensor.device == device:
                    seen[id(tensor)] = tensor.numel() * tensor.element_size() if tensor.untyped_storage().nbytes() else 0
    return sum(seen.values())


class AnonPeak:
    """This process's RssAnon, sampled every 5 ms in a thread: the peak while it runs."""

    def __init__(self) -> None:
        self.peak, self._stop = 0, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_anon())
            time.sleep(0.005)

    def __enter__(self) -> AnonPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_anon())


def rss_anon() -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("RssAnon:"))


def measure(checkpoint: Any, sp: int, held: bool, rank: int) -> dict[str, Any]:
    card = registry.resolve_card(str(checkpoint))
    deploy = DeployConfig(devices=sp, parallel=ParallelPlan(sp=sp, shard_weights=True))
    before = rss_anon()
    with AnonPeak() as host:
        if held:
            with blocks_on_host() as hold:
                instance = registry.load_instance(card, checkpoint, META, torch.float32, deploy)
        else:
            instance = registry.load_instance(card, checkpoint, META, torch.float32, deploy)
    at_load = device_bytes(instance.components)
    denoiser = instance["transformer"]
    blocks = sum(p.numel() * p.element_size() for b in denoiser.compile_units() for p in b.parameters())
    comm = types.SimpleNamespace(rank=rank, size=sp)  # slicing needs no exchange: rank and size only
    peak, slices = at_load, 0
    if not held:  # the whole instance is on the device already: that is the peak (sharding it adds the slices)
        return {"held": held, "rank": rank, "device_at_load_mib": at_load / MIB, "device_peak_mib": at_load / MIB,
                "device_after_shard_mib": None, "denoiser_blocks_mib": blocks / MIB,
                "host_anon_peak_over_load_mib": (host.peak - before) / MIB}
    for block in denoiser.compile_units():
        largest = max(p.numel() * p.element_size() for p in block.parameters())
        [handle] = shard_blocks([block], comm, META)  # type: ignore[arg-type]
        slices += sum(g.shard.numel() * g.shard.element_size() for g in handle.groups)
        peak = max(peak, device_bytes(instance.components) + slices + largest)
    hold.release(META, keep={id(b) for b in denoiser.compile_units()})
    return {"held": held, "rank": rank, "device_at_load_mib": at_load / MIB, "device_peak_mib": peak / MIB,
            "device_after_shard_mib": (device_bytes(instance.components) + slices) / MIB,
            "denoiser_blocks_mib": blocks / MIB, "host_anon_peak_over_load_mib": (host.peak - before) / MIB}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="mid", choices=sorted(SIZES))
    parser.add_argument("--sp", type=int, default=2)
    args = parser.parse_args()
    checkpoint = ensure_checkpoint(args.size)
    load = os.getloadavg()
    results = [measure(checkpoint, args.sp, held, rank) for held in (False, True) for rank in range(args.sp)]
    print_table(["hold blocks on host", "rank", "device at load MiB", "device peak MiB", "device after MiB",
                 "blocks MiB", "host anon peak MiB"],
                [[str(r["held"]), str(r["rank"]), f"{r['device_at_load_mib']:.1f}", f"{r['device_peak_mib']:.1f}",
                  "-" if r["device_after_shard_mib"] is None else f"{r['device_after_shard_mib']:.1f}",
                  f"{r['denoiser_blocks_mib']:.1f}",
                  f"{r['host_anon_peak_over_load_mib']:.1f}"] for r in results])
    write_json("shard-load.json", {"environment": environment(), "size": args.size, "sp": args.sp,
                                   "loadavg_before": load, "loadavg_after": os.getloadavg(), "results": results})


if __name__ == "__main__":
    main()
