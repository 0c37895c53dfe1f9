"""The families whose step bodies CUDA graphs capture, with tiny checkpoints and three requests each: a first one,
one of the same signature with other values (prompt, seed, conditioning), and one of a changed signature. Shared by
tests/integration/test_cuda_graph_families.py (CPU stand-in capturer) and tests/gpu/test_cuda_graph_families.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np

from tests.helpers.cosmos3_checkpoints import COSMOS3_A, write_tiny_cosmos3
from tests.helpers.far_checkpoints import FAR_A, write_tiny_far
from tests.helpers.flux2_checkpoints import TINY_BASE, write_tiny_flux2
from tests.helpers.helios_checkpoints import (
    DISTILLED_B, PYRAMID_A, TINY_A as HELIOS_A, write_tiny_helios, write_tiny_helios_pyramid,
)
from tests.helpers.hunyuan15_checkpoints import write_i2v_pipeline, write_pipeline
from tests.helpers.ltx2_checkpoints import CONFIGS as LTX2_CONFIGS, write_tiny_ltx2
from tests.helpers.sana_wm_checkpoints import SANA_WM_A, write_tiny_sana_wm
from tests.helpers.stable_audio_checkpoints import CONFIGS as STABLE_AUDIO_CONFIGS, write_tiny_stable_audio
from tests.helpers.wan_checkpoints import TINY_A
from tests.helpers.wan_i2v_checkpoints import make_image, write_tiny_wan_i2v
from vidloom.generator import VideoGenerator

WRITERS: dict[str, Callable[[Path], Path]] = {
    "anyflow-far": lambda d: write_tiny_far(d, FAR_A),
    "cosmos3": lambda d: write_tiny_cosmos3(d, COSMOS3_A),
    "flux2": lambda d: write_tiny_flux2(d, TINY_BASE),
    "helios": lambda d: write_tiny_helios(d, HELIOS_A),
    "helios-mid": lambda d: write_tiny_helios_pyramid(d, PYRAMID_A),  # 3 stages, CFG-Zero*
    "helios-distilled": lambda d: write_tiny_helios_pyramid(d, DISTILLED_B),  # 2 stages, DMD, no guidance
    "hunyuan15": lambda d: _written(write_pipeline, d, "p1"),
    "hunyuan15-i2v-meanflow": lambda d: _written(write_i2v_pipeline, d, "p2"),
    "stable-audio": lambda d: write_tiny_stable_audio(d, STABLE_AUDIO_CONFIGS[0]),
    "sana-wm": lambda d: write_tiny_sana_wm(d, SANA_WM_A),
    "ltx2": lambda d: write_tiny_ltx2(d, LTX2_CONFIGS[0]),
    "wan-i2v-clip": lambda d: write_tiny_wan_i2v(d, TINY_A),
}
STEPS = 2
SIGNATURES = {"anyflow-far": 2, "helios-mid": 3, "helios-distilled": 2}
"""Graphs one request of a kind captures (default 1): AnyFlow-FAR's rollout captures one per chunk position (its
9 frames are 3 latent frames in chunks of 1 and 2), each replayed for that chunk's STEPS steps; a Helios pyramid one
per stage (each stage's grid is another size), which every chunk replays."""
REPLAYS = {"helios": 2 * STEPS, "helios-mid": 2 * 3, "helios-distilled": 2 * 2 + 2}
"""Steps one request of a kind replays (default SIGNATURES x STEPS): Helios' two 33-frame chunks replay one graph
(the first chunk's zero history and the second's are static inputs of the same shapes); Helios-Mid's three steps per
chunk, one per stage; Helios-Distilled's first chunk twice its two steps (amplify_first_chunk), the second two."""
LEVELS = {"cosmos3": 1, "hunyuan15": 1, "hunyuan15-i2v-meanflow": 1}
"""uint8 levels a kind's replayed frames may differ from its plain run by (default 0: bit-equal): Cosmos3's graphed
step attends over its bucket-padded prefix, HunyuanVideo-1.5's over its bucket-padded condition tokens, the padding
masked, the same keys summed in another order (float32 video within 1e-5: tests/integration/test_cosmos3_cuda_graphs.py,
tests/integration/test_hunyuan15_cuda_graphs.py)."""


def _written(writer: Callable[[Path, str], Any], folder: Path, name: str) -> Path:
    """`folder`, after `writer` saved the tiny pipeline `name` there (the HunyuanVideo-1.5 writers return it)."""
    writer(folder, name)
    return folder


def graph_counts(kind: str) -> list[tuple[int, int]]:
    """(captures, replays) after each of `requests(kind)`: the second replays the first's graphs, the third
    captures its own."""
    n = SIGNATURES.get(kind, 1)
    r = REPLAYS.get(kind, n * STEPS)
    return [(n, r), (n, 2 * r), (2 * n, 3 * r)]


def requests(kind: str) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(first, same signature with other values, changed signature) generate() keywords."""
    base = dict(negative_prompt="blurry", num_inference_steps=STEPS)
    if kind == "anyflow-far":  # the rollout's KV slab: a static buffer the second request takes over
        first = dict(prompt="a red fox jumps", height=32, width=48, num_frames=9, seed=1, guidance_scale=3.0)
        second = dict(prompt="a blue cat naps", height=32, width=48, num_frames=9, seed=2, guidance_scale=4.5)
        changed = {**first, "width": 64}
    elif kind == "cosmos3":  # prompt lengths: the second's differ from the first's within their buckets, the third's
        first = dict(prompt="a red fox jumps", height=32, width=32, num_frames=5, seed=1, guidance_scale=3.0)
        second = dict(prompt="a blue cat naps on a roof", negative_prompt="blurry, dark", height=32, width=32,
                      num_frames=5, seed=2, guidance_scale=4.5)
        changed = {**first, "prompt": "a red fox jumps over the lazy dog in the snow " * 8}  # the next bucket
    elif kind == "flux2":  # reference images: their tokens are per-request tensors of the network view
        first = dict(prompt="make it purple", image=make_image(64, 64, 1), seed=1, guidance_scale=4.0)
        second = dict(prompt="make it yellow", image=make_image(64, 64, 2), seed=2, guidance_scale=3.0)
        changed = dict(prompt="make it purple", height=32, width=48, seed=1, guidance_scale=4.0)
    elif kind == "stable-audio":  # every request runs the model's one window: CFG off changes the signature
        first = dict(prompt="a red fox jumps", seed=1, guidance_scale=3.0, seconds=0.5)
        second = dict(prompt="a blue cat naps", seed=2, guidance_scale=5.0, seconds=0.5, seconds_start=0.25)
        changed = dict(prompt="a red fox jumps", seed=1, guidance_scale=1.0, seconds=0.5)
    elif kind == "sana-wm":  # the camera (intrinsics) is a per-request tensor of the network view
        shape = dict(height=64, width=96, num_frames=17, camera="jw-16")
        first = dict(prompt="a red fox jumps", image=make_image(70, 40, 1), intrinsics=[50.0, 52.0, 35.0, 20.0],
                     seed=1, guidance_scale=3.0, **shape)
        second = dict(prompt="a blue cat naps", image=make_image(70, 40, 2), intrinsics=[44.0, 47.0, 30.0, 22.0],
                      seed=2, guidance_scale=4.5, **shape)
        changed = {**first, "width": 64}
    elif kind == "hunyuan15":  # prompt-length buckets fix the graph: 27 + 14 glyph and 34 + 26 tokens share theirs
        first = dict(prompt='a sign that says "open"', height=32, width=48, num_frames=5, seed=1, guidance_scale=5.0)
        second = dict(prompt='a sign that says "closed for today"', height=32, width=48, num_frames=5, seed=2,
                      guidance_scale=3.0)
        changed = {**first, "width": 64}
    elif kind == "hunyuan15-i2v-meanflow":  # image tokens and condition latents per request; a target t per step
        first = dict(prompt='a sign that says "open"', image=make_image(50, 30, 1), num_frames=5, seed=1,
                     guidance_scale=5.0)
        second = dict(prompt='a sign that says "closed for today"', image=make_image(50, 30, 2), num_frames=5, seed=2,
                      guidance_scale=3.0)
        changed = {**first, "image": make_image(45, 80, 1)}  # a portrait aspect bucket
    elif kind.startswith("helios"):
        first, second, changed = _helios(kind)
    elif kind == "ltx2":  # fps moves the video positions (seconds): a per-request tensor of the network view
        first = dict(prompt="a red fox jumps", height=64, width=64, num_frames=9, fps=25, seed=1, guidance_scale=3.0)
        second = dict(prompt="a blue cat naps", height=64, width=64, num_frames=9, fps=24, seed=2, guidance_scale=3.0)
        changed = {**first, "width": 96}
    else:  # wan-i2v-clip: the CLIP tokens of the image are per-request tensors of the network view; the second
        # prompt's real tokens differ in count, in the same 64-key bucket of collapsed padding keys (layers.prompt_kv)
        first = dict(prompt="a red fox jumps", image=make_image(60, 41, 1), height=32, width=48, num_frames=5,
                     seed=1, guidance_scale=5.0)
        second = dict(prompt="a blue cat naps on a warm roof in the sun", image=make_image(60, 41, 2), height=32,
                      width=48, num_frames=5, seed=2, guidance_scale=4.0)
        changed = {**first, "height": 48, "width": 16, "image": make_image(16, 48, 1)}
    return tuple({**base, **r} for r in (first, second, changed))  # type: ignore[return-value]


def _helios(kind: str) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Two 33-frame chunks each (the second's history latents are the first's, per request); another width."""
    size = {"helios": (32, 48, 64), "helios-mid": (64, 128, 64), "helios-distilled": (32, 64, 32)}[kind]
    first = dict(prompt="a red fox jumps", height=size[0], width=size[1], num_frames=37, seed=1, guidance_scale=5.0)
    # The second prompt is longer: its collapsed padding keys (layers.prompt_kv) stay in the first's 64-key bucket.
    second = {**first, "prompt": "a blue cat naps on a warm roof", "seed": 2, "guidance_scale": 3.0}
    if kind == "helios-mid":  # one step per stage
        first, second = ({**r, "num_inference_steps": 3} for r in (first, second))
    elif kind == "helios-distilled":  # no guidance (nor negative prompt); the first chunk's steps doubled
        first, second = ({**r, "guidance_scale": 1.0, "negative_prompt": None, "amplify_first_chunk": True}
                         for r in (first, second))
    return first, second, {**first, "width": size[2]}


def outputs(gen: VideoGenerator, fields: dict[str, Any]) -> tuple[np.ndarray, np.ndarray | None]:
    """The output's uint8 frames (empty for sound only) and float32 waveform (None without sound)."""
    fields = dict(fields)
    out = gen.generate(fields.pop("prompt"), **fields)
    return out.frames, out.audio


def result(gen: VideoGenerator, fields: dict[str, Any]) -> np.ndarray:
    """The output's frames and waveform (LTX-2 has both, Stable Audio only sound) as one float64 vector."""
    frames, audio = outputs(gen, fields)
    parts = [frames.astype(np.float64).ravel()] + ([] if audio is None else [audio.astype(np.float64).ravel()])
    vector = np.concatenate(parts)
    assert vector.size > 0
    return vector
