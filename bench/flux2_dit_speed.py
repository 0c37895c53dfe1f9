"""One Flux2 Klein transformer forward: vidloom before vs after a change vs diffusers, float32 and bf16.

On the side-by-side report's mid checkpoint (bench/family_bench.py flux2-klein-mid: 8 heads x 128, 4 double
+ 8 single blocks; 256 image + 512 text tokens), one torch thread, CPU seconds per forward, the three
implementations interleaved (A, B, C, A, B, C, ...) within each round and the machine's load recorded per
round. "before" is vidloom's transformer at git revision --before (its source read with `git show`, run
against today's vidloom for everything it imports). Also reports each bf16 output's SNR against the same
implementation's float32 output, and each float32 output against diffusers' float32.
Writes bench/results/flux2_dit_speed.json.

    python bench/flux2_dit_speed.py --before 21db849 --rounds 6
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any, Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from family_bench import FAMILIES, ROOT  # noqa: E402  (puts the repo root on sys.path)
from report import environment, write_json  # noqa: E402

from vidloom.loading.diffusers_dir import DiffusersDir  # noqa: E402
from vidloom.loading.precision import cast_module  # noqa: E402
from vidloom.loading.safetensors_io import load_weights  # noqa: E402

TEXT_STD = 0.4  # the mid checkpoint's encoder output std (bench/flux2_precision.py)
TIMESTEP = 0.75
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def transformer_module(revision: str | None) -> types.ModuleType:
    """vidloom's Flux2 transformer module today (None) or at `revision` (its file as committed then)."""
    if revision is None:
        from vidloom.families.flux2 import transformer

        return transformer
    source = subprocess.run(["git", "show", f"{revision}:vidloom/families/flux2/transformer.py"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout
    module = types.ModuleType(f"flux2_transformer_{revision}")
    sys.modules[module.__name__] = module  # dataclasses look their module up there
    exec(compile(source, f"{revision}:vidloom/families/flux2/transformer.py", "exec"), module.__dict__)
    return module


def snr_db(approx: torch.Tensor, exact: torch.Tensor) -> float:
    exact, approx = exact.double(), approx.double()
    noise = float(((approx - exact) ** 2).mean())
    return math.inf if noise == 0 else round(10 * math.log10(float((exact**2).mean()) / noise), 2)


def build(before: str) -> tuple[dict[str, Callable[[torch.dtype], Callable[[], torch.Tensor]]], dict[str, Any]]:
    """name -> (dtype -> a no-argument forward on fixed inputs), and the inputs' description."""
    from diffusers import Flux2Transformer2DModel

    folder = DiffusersDir.open(FAMILIES["flux2-klein-mid"].checkpoint())
    weights = folder.component_dir("transformer")
    gen = torch.Generator().manual_seed(0)
    img = torch.randn(1, 256, 128, generator=gen)
    txt = torch.randn(1, 512, 768, generator=gen) * TEXT_STD
    rows, cols = torch.meshgrid(torch.arange(16), torch.arange(16), indexing="ij")
    zeros = torch.zeros(256, dtype=torch.long)
    img_ids = torch.stack([zeros, rows.flatten(), cols.flatten(), zeros], dim=-1)
    txt_ids = torch.stack([torch.zeros(512, dtype=torch.long)] * 3 + [torch.arange(512)], dim=-1)
    t = torch.tensor([TIMESTEP])

    def vidloom(module: types.ModuleType) -> Callable[[torch.dtype], Callable[[], torch.Tensor]]:
        def make(dtype: torch.dtype) -> Callable[[], torch.Tensor]:
            config = folder.parse_component("transformer", module.Flux2TransformerConfig.from_diffusers)
            model = module.Flux2Transformer(config)
            load_weights(model, weights, module.FLUX2_TRANSFORMER_NAME_MAP)
            model = cast_module(model, dtype, module.Flux2Transformer.KEEP_FP32).eval()
            i, x = img.to(dtype), txt.to(dtype)
            return lambda: model(i, x, t, img_ids, txt_ids)
        return make

    def diffusers(dtype: torch.dtype) -> Callable[[], torch.Tensor]:
        model = Flux2Transformer2DModel.from_pretrained(str(weights), torch_dtype=dtype).eval()
        i, x = img.to(dtype), txt.to(dtype)
        return lambda: model(hidden_states=i, encoder_hidden_states=x, timestep=t.to(dtype), img_ids=img_ids,
                             txt_ids=txt_ids, guidance=None, return_dict=False)[0]

    impls = {f"vidloom before ({before})": vidloom(transformer_module(before)),
             "vidloom after": vidloom(transformer_module(None)), "diffusers": diffusers}
    return impls, {"image_tokens": 256, "text_tokens": 512, "text_std": TEXT_STD, "timestep": TIMESTEP}


def measure(impls: dict[str, Callable[[torch.dtype], Callable[[], torch.Tensor]]], rounds: int) -> dict[str, Any]:
    """CPU seconds per forward, interleaved per round; outputs kept for the SNR rows."""
    out: dict[str, Any] = {}
    outputs: dict[tuple[str, str], torch.Tensor] = {}
    for dtype_name, dtype in DTYPES.items():
        forwards = {name: make(dtype) for name, make in impls.items()}
        samples: dict[str, list[float]] = {name: [] for name in forwards}
        load: list[list[float]] = []
        with torch.inference_mode():
            for name, forward in forwards.items():  # warm-up, and the output the SNR rows compare
                outputs[(name, dtype_name)] = forward().float()
            for r in range(rounds):
                load.append([round(os.getloadavg()[0], 2)])
                order = list(forwards) if r % 2 == 0 else list(reversed(forwards))  # A,B,C then C,B,A
                for name in order:
                    start = time.process_time()
                    forwards[name]()
                    samples[name].append(round(time.process_time() - start, 4))
                load[-1].append(round(os.getloadavg()[0], 2))
                print(dtype_name, r, {n: s[-1] for n, s in samples.items()}, "load", load[-1], flush=True)
        medians = {name: round(statistics.median(s), 4) for name, s in samples.items()}
        ref = medians["diffusers"]
        names = list(forwards)
        out[dtype_name] = {
            "cpu_s": samples, "median_cpu_s": medians, "loadavg_1m_per_round": load,
            "speedup_vs_diffusers": {n: round(ref / m, 3) for n, m in medians.items()},
            "after_over_before_speedup": round(medians[names[0]] / medians[names[1]], 3),
        }
        del forwards
    names = list(impls)
    out["quality"] = {
        **{f"{n} bfloat16 vs its float32 (SNR dB)": snr_db(outputs[(n, "bfloat16")], outputs[(n, "float32")])
           for n in names},
        **{f"{n} float32 vs diffusers float32 (max abs)": float((outputs[(n, "float32")]
                                                                 - outputs[("diffusers", "float32")]).abs().max())
           for n in names[:2]},
    }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="21db849", help="git revision of the 'before' transformer")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    impls, inputs = build(args.before)
    result = measure(impls, args.rounds)
    print(result["quality"])
    write_json("flux2_dit_speed.json", {
        "what": "one Flux2 Klein transformer forward on flux2-klein-mid, CPU seconds, settings interleaved per "
                "round (order reversed every other round)",
        "environment": environment(), "threads": args.threads, "before": args.before, "inputs": inputs, **result,
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
