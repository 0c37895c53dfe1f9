"""LTX-2 denoiser speed on the ltx2-mid transformer: vidloom before a change, vidloom now, diffusers, one process.

Times (CPU seconds, one torch thread) the two things a denoise step is made of at the side-by-side request
(256x256, 25 frames, CFG 3 and the pipeline's default STG / modality guidance):
- `forward`: one batch-2 forward (the CFG pair) of the transformer as the step runs it. vidloom: the request's
  LTX2Network (its embed / blocks / head, with what it reuses across steps); diffusers: LTX2VideoTransformer3DModel.
- `step`: one whole guided step. vidloom: the loop's step body (AudioVideoGuidance over the network, after the
  loop's init); diffusers: the pipeline's three transformer calls (CFG pair, STG on block 28, modality isolation).
"Before" is vidloom at another git revision (`--before REV`), imported from a copy of its package renamed to
`vidloom_before`, so both run in this process; the three are interleaved (A, B, C, A, B, C...) and the load average
is recorded with every round.

    python bench/ltx2_dit_speed.py [--before 21db849] [--rounds 7] [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import Any, Callable

import torch

from report import environment, write_json

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.helpers.ltx2_checkpoints import TinyLTX2  # noqa: E402

VIDEO = (4, 8, 8)  # latent frames, height, width of 25 frames at 256x256 (8x time, 32x space)
AUDIO_FRAMES = 26  # audio latents of 25 frames at 24 fps (16 kHz, hop 160, 4x)
TEXT_TOKENS = 1024  # LTX2Pipeline's max_sequence_length
FPS = 24.0


def _checkpoint(spec: TinyLTX2, folder: Path) -> Path:
    from diffusers import LTX2VideoTransformer3DModel

    if not (folder / "config.json").exists():
        torch.manual_seed(3)
        LTX2VideoTransformer3DModel(caption_channels=spec.text_hidden, **spec.transformer).save_pretrained(str(folder))
    return folder


def _package_at(rev: str, into: Path) -> str:
    """vidloom at `rev`, unpacked under `into` as the package `vidloom_before`; the package name."""
    archive = subprocess.run(["git", "archive", rev, "vidloom"], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    (into / "vidloom").rename(into / "vidloom_before")
    for path in (into / "vidloom_before").rglob("*.py"):
        text = path.read_text()
        path.write_text(re.sub(r"\bvidloom\.", "vidloom_before.", text))
    sys.path.insert(0, str(into))
    return "vidloom_before"


def _first_module(package: str, *paths: str) -> Any:
    """The first of `paths` (today's layout, then older ones: before #34 the family code sat in recipes/)."""
    for path in paths[:-1]:
        try:
            return importlib.import_module(f"{package}.{path}")
        except ModuleNotFoundError:
            continue
    return importlib.import_module(f"{package}.{paths[-1]}")


def _vidloom_step(package: str, folder: Path, dtype: torch.dtype, cpu: torch.device) -> dict[str, Callable[[], Any]]:
    """The loop's step body and the CFG pair's forward of vidloom (`package`) at `folder`'s weights."""
    tmod = importlib.import_module(f"{package}.models.ltx2.transformer")
    rope = importlib.import_module(f"{package}.models.ltx2.rope")
    loop_mod = _first_module(package, "families.ltx2.loop", "recipes.ltx2.loop")
    text_mod = _first_module(package, "models.ltx2.text", "recipes.ltx2.text")
    scales_mod = importlib.import_module(f"{package}.diffusion.av_guidance")
    load_weights = importlib.import_module(f"{package}.loading.safetensors_io").load_weights
    config = tmod.LTX2TransformerConfig.from_diffusers(json.loads((folder / "config.json").read_text()))
    dit = tmod.LTX2Transformer(config).eval()
    load_weights(dit, folder, tmod.LTX2_TRANSFORMER_NAME_MAP)
    dit.to(dtype)
    c, (f, h, w) = config, VIDEO
    positions = tmod.LTX2Positions(
        rope.video_positions(1, f, h, w, patch_t=1, patch=1, scale=c.vae_scale_factors, causal_offset=c.causal_offset,
                             fps=FPS, device=cpu),
        rope.audio_positions(1, AUDIO_FRAMES, patch_t=1, scale=c.audio_scale_factor, causal_offset=c.causal_offset,
                             hop_length=c.audio_hop_length, sample_rate=c.audio_sampling_rate, device=cpu))
    layout = loop_mod.LTX2Layout(f, h, w, AUDIO_FRAMES, positions, FPS)
    g = torch.Generator().manual_seed(0)

    def text() -> Any:
        return text_mod.LTX2Text(torch.randn(1, TEXT_TOKENS, c.caption_channels, generator=g).to(dtype),
                                 torch.randn(1, TEXT_TOKENS, c.caption_channels, generator=g).to(dtype),
                                 torch.ones(1, TEXT_TOKENS, dtype=torch.int64))

    prompt, negative = text(), text()
    loop = loop_mod.LTX2DenoiseLoop(
        "stage1", dit, dtype, lambda r, n: torch.linspace(1.0, 0.0, 7), lambda r: scales_mod.AudioVideoScales(),
        use_cross_timestep=True)
    slots = {"request": None, "layout": layout, "video_latents": torch.randn(1, f * h * w, c.in_channels, generator=g),
             "audio_latents": torch.randn(1, AUDIO_FRAMES, c.audio_in_channels, generator=g),
             "prompt_text": prompt, "negative_text": negative}
    state = loop.init(slots, None)
    plan = loop.next(state)
    net, inputs = state.network, plan.inputs
    two = lambda t: torch.cat([t, t])  # noqa: E731
    pair = (two(state.video), two(state.audio), None, two(inputs["timestep"]), two(inputs["audio_timestep"]))

    def forward() -> Any:
        return net(pair[0], pair[1], negative.cat(prompt), pair[3], pair[4])

    return {"forward": forward, "step": lambda: plan.call(**inputs)}


def _diffusers_step(folder: Path, dtype: torch.dtype, cpu: torch.device) -> dict[str, Callable[[], Any]]:
    """LTX2Pipeline's three transformer calls of a step (its __call__ defaults), and the CFG pair's alone."""
    from diffusers import LTX2VideoTransformer3DModel

    dit = LTX2VideoTransformer3DModel.from_pretrained(str(folder), torch_dtype=dtype).eval()
    c, (f, h, w) = dit.config, VIDEO
    g = torch.Generator().manual_seed(0)
    video = torch.randn(1, f * h * w, c.in_channels, generator=g).to(dtype)
    audio = torch.randn(1, AUDIO_FRAMES, c.audio_in_channels, generator=g).to(dtype)
    text = torch.randn(2, TEXT_TOKENS, c.caption_channels, generator=g).to(dtype)
    mask = torch.ones(2, TEXT_TOKENS, dtype=torch.int64)
    video_coords = dit.rope.prepare_video_coords(2, f, h, w, cpu, fps=FPS)
    audio_coords = dit.audio_rope.prepare_audio_coords(2, AUDIO_FRAMES, cpu)

    def call(rows: slice, **extra: Any) -> Any:
        n = rows.stop - rows.start
        t = torch.full((n,), 1000.0)
        return dit(hidden_states=video.repeat(n, 1, 1), audio_hidden_states=audio.repeat(n, 1, 1),
                   encoder_hidden_states=text[rows], audio_encoder_hidden_states=text[rows], timestep=t, sigma=t,
                   encoder_attention_mask=mask[rows], audio_encoder_attention_mask=mask[rows],
                   num_frames=f, height=h, width=w, fps=FPS, audio_num_frames=AUDIO_FRAMES,
                   video_coords=video_coords[rows], audio_coords=audio_coords[rows], use_cross_timestep=True,
                   return_dict=False, **extra)

    def step() -> None:
        call(slice(0, 2), isolate_modalities=False, spatio_temporal_guidance_blocks=None)
        call(slice(1, 2), isolate_modalities=False, spatio_temporal_guidance_blocks=[28])
        call(slice(1, 2), isolate_modalities=True, spatio_temporal_guidance_blocks=None)

    return {"forward": lambda: call(slice(0, 2)), "step": step}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="21db849", help="git revision of the 'before' vidloom")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--out", default="ltx2_dit_speed.json")
    args = parser.parse_args()
    from ltx2 import MID

    torch.set_num_threads(1)
    dtype, cpu = getattr(torch, args.dtype), torch.device("cpu")
    with tempfile.TemporaryDirectory() as tmp, torch.inference_mode():
        folder = _checkpoint(MID, Path(tmp) / "transformer")
        before = _package_at(args.before, Path(tmp))
        engines = {"vidloom before": _vidloom_step(before, folder, dtype, cpu),
                   "vidloom": _vidloom_step("vidloom", folder, dtype, cpu),
                   "diffusers": _diffusers_step(folder, dtype, cpu)}
        times: dict[str, dict[str, list[float]]] = {e: {"forward": [], "step": []} for e in engines}
        loads = []
        for fns in engines.values():  # warm-up: first calls allocate and fill per-request caches
            for fn in fns.values():
                fn()
        for _ in range(args.rounds):
            loads.append(os.getloadavg())
            for kind in ("forward", "step"):
                for name, fns in engines.items():
                    start = time.process_time()
                    fns[kind]()
                    times[name][kind].append(time.process_time() - start)
    medians = {name: {kind: median(v) for kind, v in kinds.items()} for name, kinds in times.items()}
    ratios = {kind: {f"{other} / vidloom": round(medians[other][kind] / medians["vidloom"][kind], 3)
                     for other in ("vidloom before", "diffusers")} for kind in ("forward", "step")}
    for name, m in medians.items():
        print(f"{name:16s} forward {m['forward'] * 1e3:7.1f} ms   step {m['step'] * 1e3:7.1f} ms")
    print(json.dumps(ratios, indent=1))
    write_json(args.out, {
        "what": "ltx2-mid transformer (bench/ltx2.py MID), CPU seconds, one thread; forward = the CFG pair's "
                "batch-2 forward, step = a whole guided step (CFG pair + STG + modality as each side runs it)",
        "dtype": args.dtype, "before": args.before, "rounds": args.rounds,
        "shape": {"video_tokens": VIDEO[0] * VIDEO[1] * VIDEO[2], "audio_tokens": AUDIO_FRAMES,
                  "text_tokens": TEXT_TOKENS},
        "median_s": medians, "ratios": ratios, "times_s": times, "loadavg": loads, "environment": environment(),
    })


if __name__ == "__main__":
    main()
