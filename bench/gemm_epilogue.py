"""Does fusing a GEMM's epilogue into oneDNN's linear pay on this CPU? float32, CPU seconds, interleaved, best of N.

(a) tanh-GELU on an FFN's up-projection: `F.gelu(F.linear(x, w, b), approximate="tanh")` against
    `torch.ops.mkldnn._linear_pointwise(x, w, b, "gelu", [], "tanh")` (what vidloom.layers.fused_linear runs),
    the weight used as is and prepacked by `torch.ops.mkldnn._reorder_linear_weight`;
(b) the residual add on a down / out projection: `r + F.linear(x, w, b)` against
    `torch.ops.mkldnn._linear_pointwise(x, r, w, b, "add")` (the binary post-op).
Each pair's calls alternate (one of each per round), so load on the shared machine hits both alike. The max
absolute difference against the unfused path is float32 rounding (oneDNN's GEMM blocking and its GELU).
(c) `fused_off_on`: a whole model step with vidloom's fused path off and on (bench/cpu_efficiency.py runs it on
    each model's float32 step). bench/cpu_efficiency.py records (a) and (b) in its JSON; run alone:

    python bench/gemm_epilogue.py
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import environment, write_json  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from vidloom.layers import fused_linear  # noqa: E402

# (tokens, in, out) of tanh-GELU FFN up-projections: Wan2.1-1.3B at one 480p-ish frame and at 4 frames, LTX-2's
# video FFN (4096 -> 16384), a Helios/Wan-14B-wide one (5120 -> 13824).
GELU_SHAPES = {"wan1.3b ffn up @512": (512, 1536, 8960), "wan1.3b ffn up @2048": (2048, 1536, 8960),
               "ltx2 video ffn up @1024": (1024, 4096, 16384), "14b-wide ffn up @512": (512, 5120, 13824)}
ADD_SHAPES = {"wan1.3b ffn down + residual @512": (512, 8960, 1536), "wan1.3b out + residual @512": (512, 1536, 1536)}


def interleaved_ms(fns: dict[str, Callable[[], Any]], rounds: int) -> dict[str, list[float]]:
    """CPU ms of each function's call in each of `rounds` rounds (one call of each per round, so load on the shared
    machine hits all alike), after one warm-up call each."""
    for fn in fns.values():
        fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.process_time()
            fn()
            samples[name].append((time.process_time() - start) * 1e3)
    return samples


def _interleaved(fns: dict[str, Callable[[], Any]], rounds: int) -> dict[str, float]:
    """Best CPU ms of each function over `rounds` interleaved rounds."""
    return {name: round(min(ms), 2) for name, ms in interleaved_ms(fns, rounds).items()}


def _operands(m: int, k: int, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return torch.randn(m, k, generator=gen), torch.randn(n, k, generator=gen) / k**0.5, torch.randn(n, generator=gen)


def gelu_epilogue(m: int, k: int, n: int, rounds: int) -> dict[str, Any]:
    """Unfused against fused linear + tanh-GELU at one (M, K, N), float32."""
    x, w, b = _operands(m, k, n)
    packed = torch.ops.mkldnn._reorder_linear_weight(w, None)
    fused = torch.ops.mkldnn._linear_pointwise
    with torch.inference_mode():
        ms = _interleaved({"unfused": lambda: F.gelu(F.linear(x, w, b), approximate="tanh"),
                           "fused": lambda: fused(x, w, b, "gelu", [], "tanh"),
                           "fused_prepacked": lambda: fused(x, packed, b, "gelu", [], "tanh")}, rounds)
        diff = (fused(x, w, b, "gelu", [], "tanh") - F.gelu(F.linear(x, w, b), approximate="tanh")).abs().max()
    return {"shape_mkn": [m, k, n], "cpu_ms": ms, "speedup": round(ms["unfused"] / ms["fused"], 3),
            "speedup_prepacked": round(ms["unfused"] / ms["fused_prepacked"], 3), "max_abs_diff": diff.item()}


def add_epilogue(m: int, k: int, n: int, rounds: int) -> dict[str, Any]:
    """Unfused against fused linear + residual add at one (M, K, N), float32."""
    x, w, b = _operands(m, k, n)
    residual = torch.randn(m, n, generator=torch.Generator().manual_seed(1))
    fused = torch.ops.mkldnn._linear_pointwise
    with torch.inference_mode():
        ms = _interleaved({"unfused": lambda: residual + F.linear(x, w, b),
                           "fused": lambda: fused(x, residual, w, b, "add")}, rounds)
        diff = (fused(x, residual, w, b, "add") - (residual + F.linear(x, w, b))).abs().max()
    return {"shape_mkn": [m, k, n], "cpu_ms": ms, "speedup": round(ms["unfused"] / ms["fused"], 3),
            "max_abs_diff": diff.item()}


def unfused(step: Callable[[], Any]) -> Callable[[], Any]:
    """`step` with vidloom.layers.fused_linear's path off (F.linear + F.gelu wherever it would fuse)."""
    def off() -> Any:
        with mock.patch.object(fused_linear, "fused_applies", lambda *args: False):
            return step()
    return off


def fused_off_on(step: Callable[[], Any], rounds: int) -> dict[str, Any]:
    """A whole model step with vidloom.layers.fused_linear's path off (F.linear + F.gelu) and on, interleaved."""
    ms = _interleaved({"unfused": unfused(step), "fused": step}, rounds)
    return {"cpu_ms": ms, "speedup": round(ms["unfused"] / ms["fused"], 3)}


def epilogues(gelu: dict[str, tuple[int, int, int]], add: dict[str, tuple[int, int, int]],
              rounds: int) -> dict[str, Any]:
    """Both measurements at the given named shapes, with the load average before and after."""
    load = [round(v, 2) for v in os.getloadavg()]
    out = {"gelu_tanh": {name: gelu_epilogue(*shape, rounds) for name, shape in gelu.items()},
           "residual_add": {name: add_epilogue(*shape, rounds) for name, shape in add.items()}}
    return {**out, "rounds": rounds, "loadavg_start": load, "loadavg_end": [round(v, 2) for v in os.getloadavg()]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--output", default="gemm_epilogue.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    result = epilogues(GELU_SHAPES, ADD_SHAPES, args.rounds)
    print(json.dumps(result, indent=1))
    write_json(args.output, {"environment": environment(), "torch_threads": 1, **result})
    return 0


if __name__ == "__main__":
    sys.exit(main())
