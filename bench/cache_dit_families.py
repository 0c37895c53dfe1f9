"""The families bench/vs_cache_dit.py runs through both systems: per family, the checkpoint, the diffusers call and
the vidloom request at each size (`tiny` for --smoke, `mid` for the sweep).

A family is here when cache-dit (installed v1.5.3) registers a block adapter for its diffusers pipeline and the
benchmarks can write a random-weight checkpoint of it: Wan (bench/checkpoints.py sizes), Flux2 Klein, Qwen-Image,
LTX-2, HunyuanVideo-1.5, Helios, Cosmos3 and Stable Audio (the mid checkpoints of bench/family_bench.py, the tiny ones of the
tests). Left out, with the reason in `NOT_RUN`: families cache-dit has no adapter for, or whose checkpoint the
benchmarks do not write at mid size.

The mid requests are family_bench's, with more denoise steps (`CACHE_STEPS`): a cache can only skip steps after its
warm-up, and 4-6 steps leave it almost nothing to skip.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from checkpoints import SIZES as WAN_SIZES
from family_bench import FAMILIES, FamilyBench, _call_cosmos3, _call_flux2, _call_helios, _call_hunyuan15, \
    _call_ltx2, _call_qwen_image, _call_stable_audio, _call_wan

CACHE_STEPS = 12
"""Denoise steps of every non-Wan mid run (Wan keeps its size's 20)."""
SMOKE_STEPS = 4


@dataclass(frozen=True)
class CacheTarget:
    """One family at one size, as both systems run it."""

    family: str
    bench: FamilyBench
    """The checkpoint writer, the diffusers pipeline class and call, and the request (bench/family_bench.py)."""
    steps: int
    vidloom_dtype: str | None
    """float32 so both systems run one dtype; None (vidloom's default, bfloat16 on CPU) keeps the Wan path as first
    recorded."""

    def checkpoint(self) -> Path:
        return self.bench.checkpoint()

    def blocks(self) -> int:
        """The DiT's block count (every block list summed): Fn + Bn must leave middle blocks to cache."""
        config = json.loads((self.checkpoint() / "transformer" / "config.json").read_text())
        return sum(config.get(k, 0) for k in ("num_layers", "num_single_layers", "num_hidden_layers"))

    def call_reference(self, pipe: Any, steps: int) -> np.ndarray:
        return np.asarray(self.bench.reference_call(pipe, self.bench.request, steps), dtype=np.float32)

    def vidloom_request(self, steps: int, threshold: float | None) -> Any:
        return replace(self.bench.vidloom_request(steps), step_cache_threshold=threshold)


def _wan(size: str) -> CacheTarget:
    from tests.helpers.wan_checkpoints import write_tiny_wan

    s = WAN_SIZES[size]
    bench = FamilyBench(f"wan-{size}", lambda folder: write_tiny_wan(folder, s.spec), "WanPipeline",
                        dict(height=s.height, width=s.width, num_frames=s.num_frames, steps=s.steps, guidance=5.0),
                        _call_wan, folder=s.spec.name)
    return CacheTarget("wan", bench, s.steps, None)


def _tiny_flux2(folder: Path) -> None:
    from tests.helpers.flux2_checkpoints import TINY_BASE, write_tiny_flux2

    write_tiny_flux2(folder, TINY_BASE)


def _tiny_qwen_image(folder: Path) -> None:
    from tests.helpers.qwen_image_checkpoints import write_qwen_image_wide

    write_qwen_image_wide(folder)


def _tiny_ltx2(folder: Path) -> None:
    from tests.helpers.ltx2_checkpoints import CONFIGS, write_tiny_ltx2

    write_tiny_ltx2(folder, CONFIGS[0])


def _tiny_hunyuan15(folder: Path) -> None:
    from tests.helpers.hunyuan15_checkpoints import write_pipeline

    write_pipeline(folder, "p1")


def _tiny_helios(folder: Path) -> None:
    from tests.helpers.helios_checkpoints import TINY_A, write_tiny_helios

    write_tiny_helios(folder, TINY_A)


def _tiny_cosmos3(folder: Path) -> None:
    from tests.helpers.cosmos3_checkpoints import write_tiny_cosmos3

    write_tiny_cosmos3(folder)


def _tiny_stable_audio(folder: Path) -> None:
    from tests.helpers.stable_audio_checkpoints import TINY_STEREO, write_tiny_stable_audio

    write_tiny_stable_audio(folder, TINY_STEREO)  # 2 blocks, a 1 s window at 256 Hz


# family -> (family_bench mid name, tiny writer, the tiny request, the tiny reference call)
_FAMILIES: dict[str, tuple[str, Any, dict[str, Any], Any]] = {
    "flux2": ("flux2-klein-mid", _tiny_flux2, dict(height=32, width=32, num_frames=1, guidance=4.0), _call_flux2),
    "qwen-image": ("qwen-image-mid", _tiny_qwen_image, dict(height=32, width=32, num_frames=1, guidance=4.0),
                   _call_qwen_image),
    "ltx2": ("ltx2-mid", _tiny_ltx2, dict(height=64, width=64, num_frames=9, fps=25, guidance=3.0), _call_ltx2),
    "hunyuan15": ("hunyuan15-mid", _tiny_hunyuan15, dict(height=32, width=32, num_frames=5, guidance=6.0),
                  _call_hunyuan15),
    "helios": ("helios-mid", _tiny_helios, dict(height=32, width=48, num_frames=33, guidance=5.0), _call_helios),
    "cosmos3": ("cosmos3-mid", _tiny_cosmos3, dict(height=32, width=32, num_frames=9, fps=16, guidance=3.0),
                _call_cosmos3),
    "stable-audio": ("stable-audio-mid", _tiny_stable_audio, dict(seconds=1.0, guidance=7.0), _call_stable_audio),
}
FAMILY_NAMES = ("wan", *_FAMILIES)

NOT_RUN = {
    "sana-wm": "cache-dit 1.5.3's Sana adapter asserts a SanaTransformer2DModel; SANA-WM's diffusers pipeline has its "
               "own transformer class",
    "anyflow-far": "cache-dit 1.5.3 registers no AnyFlow-FAR adapter",
}

CACHE_DIT_FAILS = {
    "ltx2": "__patch_transformer_forward__() got an unexpected keyword argument 'sigma'",
    "cosmos3": "__patch_transformer_forward__() got an unexpected keyword argument 'return_dict'",
}
"""Families cache-dit 1.5.3 registers whose cached forward fails under the installed diffusers (0.42.1): its patch
functor's replacement forward does not take an argument the pipeline now passes. Their cache-dit rows are the
error; vidloom's rows still run."""


def target(family: str, size: str) -> CacheTarget:
    """The family at `size`: Wan takes any bench/checkpoints.py size, the others `tiny` or `mid`."""
    if family == "wan":
        return _wan(size)
    if family not in _FAMILIES:
        raise SystemExit(f"--families: {family!r} is not one of {', '.join(FAMILY_NAMES)}"
                         + (f" ({NOT_RUN[family]})" if family in NOT_RUN else ""))
    mid_name, write_tiny, tiny_request, call = _FAMILIES[family]
    mid = FAMILIES[mid_name]
    if size == "mid":
        return CacheTarget(family, replace(mid, request={**mid.request, "steps": CACHE_STEPS}), CACHE_STEPS, "float32")
    if size != "tiny":
        raise SystemExit(f"--size: {family} runs at tiny or mid, not {size!r}")
    tiny = FamilyBench(f"{family}-cache-tiny", write_tiny, mid.pipeline, {**tiny_request, "steps": SMOKE_STEPS}, call,
                       load_kwargs=mid.load_kwargs, warmup_steps=mid.warmup_steps, output=mid.output)
    return CacheTarget(family, tiny, SMOKE_STEPS, "float32")
