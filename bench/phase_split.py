"""Per-phase CPU and wall seconds of one generation: text encode, denoise, decode, and the rest.

A phase is the time spent inside the modules of a pipeline's components: `text_encoder` and `connectors` are
the text encode, `transformer` (and `transformer_2`) the denoise, `vae`, `audio_vae` and `vocoder` the decode
(these text-to-video/image requests encode no media). Global module hooks see every nn.Module call; only the
outermost call into a component's modules opens and closes its phase, so nested calls are counted once.
What falls outside every phase (tokenizing, the scheduler, latent preparation, turning frames into arrays)
is `other`: total minus the phases. A component that is not an nn.Module (vidloom's text encoders wrap one)
contributes the modules among its attributes. Cosmos3 has no text encoder: its text prefix runs in the
transformer, on both sides, so it is part of its denoise.

The hooks cost a Python call per module call (`hook_calls` in the result; about 3.7 us of CPU each, measured
here on a chain of Identity modules). Phases are process CPU time (torch's intra-op threads included), opened and
closed per thread; `threads` > 1 says phases ran on several threads and may overlap.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Mapping

import torch

PHASE_OF = {"text_encoder": "text_encode", "connectors": "text_encode", "transformer": "denoise",
            "transformer_2": "denoise", "vae": "decode", "audio_vae": "decode", "vocoder": "decode"}
"""Component name -> phase; components not named here count as `other`."""
PHASES = ("text_encode", "denoise", "decode")


def _modules_of(component: Any) -> list[torch.nn.Module]:
    if isinstance(component, torch.nn.Module):
        return list(component.modules())
    found: list[torch.nn.Module] = []
    for value in vars(component).values() if hasattr(component, "__dict__") else ():
        if isinstance(value, torch.nn.Module):
            found.extend(value.modules())
    return found


def module_phases(components: Mapping[str, Any]) -> dict[int, str]:
    """id(module) -> phase for every module of the named components (a module shared by two phases keeps
    the first in PHASE_OF's order)."""
    phase_of: dict[int, str] = {}
    for name in PHASE_OF:
        if components.get(name) is not None:
            for module in _modules_of(components[name]):
                phase_of.setdefault(id(module), PHASE_OF[name])
    return phase_of


class PhaseTimer:
    """`with PhaseTimer(components) as timer: generate()`, then `timer.split()`."""

    def __init__(self, components: Mapping[str, Any]) -> None:
        self._phase_of = module_phases(components)
        self._local = threading.local()
        self._cpu = dict.fromkeys(PHASES, 0.0)
        self._wall = dict.fromkeys(PHASES, 0.0)
        self._threads: set[int] = set()
        self.hook_calls = 0
        self.calls = dict.fromkeys(PHASES, 0)  # outermost entries into each phase's modules
        self._handles: list[Any] = []

    def _enter(self, module: torch.nn.Module, *_: Any) -> None:
        self.hook_calls += 1
        phase = self._phase_of.get(id(module))
        if phase is None:
            return
        local = self._local
        depth = getattr(local, "depth", 0)
        if depth == 0:
            local.phase, local.cpu0, local.wall0 = phase, time.process_time(), time.perf_counter()
            self._threads.add(threading.get_ident())
            self.calls[phase] += 1
        local.depth = depth + 1

    def _exit(self, module: torch.nn.Module, *_: Any) -> None:
        if id(module) not in self._phase_of:
            return
        local = self._local
        local.depth -= 1
        if local.depth == 0:
            self._cpu[local.phase] += time.process_time() - local.cpu0
            self._wall[local.phase] += time.perf_counter() - local.wall0

    def __enter__(self) -> "PhaseTimer":
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

        self._handles = [register_module_forward_pre_hook(self._enter),
                         register_module_forward_hook(self._exit, always_call=True)]
        self._cpu0, self._wall0 = time.process_time(), time.perf_counter()
        return self

    def __exit__(self, *_: Any) -> None:
        self._cpu_total, self._wall_total = time.process_time() - self._cpu0, time.perf_counter() - self._wall0
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def split(self) -> dict[str, Any]:
        """{phase: {"cpu_s", "wall_s"}} for text_encode, denoise, decode and other, plus hook_calls, threads."""
        out: dict[str, Any] = {p: {"cpu_s": round(self._cpu[p], 3), "wall_s": round(self._wall[p], 3)}
                               for p in PHASES}
        out["other"] = {"cpu_s": round(self._cpu_total - sum(self._cpu.values()), 3),
                        "wall_s": round(self._wall_total - sum(self._wall.values()), 3)}
        out.update(hook_calls=self.hook_calls, threads=len(self._threads))
        return out


def timed_phases(components: Mapping[str, Any], run: Callable[[], Any]) -> tuple[Any, dict[str, Any]]:
    """run() under a PhaseTimer: (its result, the split)."""
    with PhaseTimer(components) as timer:
        result = run()
    return result, timer.split()
