"""SANA-WM two-stage: vidloom's time to the first refined chunk (streamed) vs the reference end to end.

One process, one random-weight SanaWMPipeline folder with a refiner/ beside it, written by diffusers and
transformers (MID below, or the tests' tiny config with --tiny). The same request both ways: a first frame,
a prompt, a WASD/IJKL camera string and intrinsics, fp32 on CPU.

- vidloom (`DeployConfig(two_stage=True)`): stage 1 (bidirectional SANA DiT), then the chunk-causal LTX-2
  refiner, each refined chunk decoded and sent as a ChunkEvent as soon as it is done. Timed: the first
  ChunkEvent (what a streaming client waits for before it can show anything) and the whole generation.
- reference: `SanaWMPipeline(..., output_type="latent")` then `SanaWMLTX2Refiner(latents, ...)` to frames.
  It returns frames only at the end, so its time to the first frame is its total.

Each round runs both (the order alternating, after a 1-step warm-up of each), recording the 1-minute load
average and the busy fraction of the CPUs before each run; the summary keeps the median of the rounds. The
frames of the two are compared (the parity tests bound them at 1e-4; here reported, not asserted).
Where the time goes (`phases_s` per run): vidloom's progress-event seconds summed per phase (`stage1`: the
stage-1 denoise steps; `refine_sink`, `refine`, `refine_kv`: the refiner DiT's passes; `refine_chunks`: each
chunk's whole time, its decode included; `refine_decode` reports no seconds of its own), the reference's
`SanaWMPipeline` call (`stage1`, text and image encode included) and the refiner call after it.

    OMP_NUM_THREADS=1 python bench/sana_wm.py [--rounds 3] [--frames 81] [--tiny]
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

import world_bench as wb  # noqa: I001 (first: it puts the repository root on sys.path)
from report import print_table  # noqa: E402
from tests.helpers.sana_wm_checkpoints import SANA_WM_A, write_tiny_refiner, write_tiny_sana_wm  # noqa: E402

# SANA_WM_A's layout (GDN + softmax blocks, K-only short convs) widened and deepened; the refiner likewise.
MID = dataclasses.replace(
    SANA_WM_A, name="sana-wm-mid",
    transformer={**SANA_WM_A.transformer, "num_layers": 4, "hidden_size": 256, "num_attention_heads": 4,
                 "linear_head_dim": 64},
    refiner={**SANA_WM_A.refiner, "num_attention_heads": 4, "attention_head_dim": 32, "cross_attention_dim": 128,
             "num_layers": 4},
)
PROMPT = "a car driving across a vast desert plain"
CAMERA = "w-40,jw-24,ik-16"
INTRINSICS = [50.0, 52.0, 35.0, 20.0]
GUIDANCE, SEED, FPS = 4.0, 3, 16
# (height, width, frames, stage-1 steps) per scale. Mid: 8x12 latent cells, 81 frames = 11 latent frames = the
# sink and 4 refiner chunks (3, 3, 3, 1 latent frames). Tiny: the tests' 41 frames (2 chunks).
SIZES = {"mid": (256, 384, 81, 4), "tiny": (64, 96, 41, 2)}
ENGINES = ("vidloom", "reference")


def _checkpoint(tiny: bool, cache: Path) -> Path:
    spec = SANA_WM_A if tiny else MID

    def write(folder: Path) -> None:
        write_tiny_sana_wm(folder, spec)
        write_tiny_refiner(folder, spec)

    return wb.cached_checkpoint(cache, spec.name, "refiner/model_index.json", write)


def _image(height: int, width: int) -> Any:
    return wb.first_frame(height, width, seed=0)


class Vidloom:
    def __init__(self, folder: Path) -> None:
        from vidloom.core.deploy import DeployConfig
        from vidloom.generator import VideoGenerator

        self.generator = VideoGenerator.from_pretrained(folder, device="cpu", deploy=DeployConfig(two_stage=True))

    def run(self, size: tuple[int, int, int, int], steps: int | None = None) -> dict[str, Any]:
        from vidloom.core.output import ChunkEvent, ProgressEvent

        height, width, frames, default_steps = size
        wall0, cpu0 = wb.clock()
        firsts: list[tuple[float, float]] = []
        chunks: list[int] = []
        phases: dict[str, float] = {}

        def on_event(event: Any) -> None:
            if isinstance(event, ProgressEvent):  # where the time goes: summed wall seconds per phase
                phases[event.phase] = phases.get(event.phase, 0.0) + event.seconds
            if isinstance(event, ChunkEvent):
                if not firsts:
                    wall, cpu = wb.clock()
                    firsts.append((wall - wall0, cpu - cpu0))
                chunks.append(event.chunk.stop_frame - event.chunk.start_frame)

        out = self.generator.generate(PROMPT, image=_image(height, width), camera=CAMERA, intrinsics=INTRINSICS,
                                      height=height, width=width, num_frames=frames,
                                      num_inference_steps=steps or default_steps, guidance_scale=GUIDANCE, seed=SEED,
                                      fps=FPS, negative_prompt="", on_event=on_event)
        wall1, cpu1 = wb.clock()
        return {"total_s": wall1 - wall0, "total_cpu_s": cpu1 - cpu0, "first_chunk_s": firsts[0][0],
                "first_chunk_cpu_s": firsts[0][1], "chunk_frames": chunks,
                "phases_s": {k: round(v, 3) for k, v in phases.items()}, "frames": out.frames}


class Reference:
    def __init__(self, folder: Path) -> None:
        import torch
        from diffusers import SanaWMLTX2Refiner, SanaWMPipeline

        self.pipe = SanaWMPipeline.from_pretrained(str(folder), dtype=torch.float32)
        self.pipe.set_progress_bar_config(disable=True)
        self.refiner = SanaWMLTX2Refiner.from_pretrained(str(folder / "refiner"), dtype=torch.float32,
                                                         vae=self.pipe.vae)
        self.refiner.set_progress_bar_config(disable=True)

    def run(self, size: tuple[int, int, int, int], steps: int | None = None) -> dict[str, Any]:
        import torch

        height, width, frames, default_steps = size
        wall0, cpu0 = wb.clock()
        latents = self.pipe(image=_image(height, width), prompt=PROMPT, negative_prompt="", intrinsics=INTRINSICS,
                            action=CAMERA, height=height, width=width, num_frames=frames,
                            num_inference_steps=steps or default_steps, guidance_scale=GUIDANCE,
                            generator=torch.Generator().manual_seed(SEED), output_type="latent").frames
        stage1 = time.perf_counter()
        video = self.refiner(latents, PROMPT, fps=float(FPS), generator=torch.Generator().manual_seed(SEED),
                             output_type="np")
        wall1, cpu1 = wb.clock()
        uint8 = (np.clip(np.asarray(video), 0, 1) * 255).round().astype(np.uint8)
        return {"total_s": wall1 - wall0, "total_cpu_s": cpu1 - cpu0, "first_chunk_s": wall1 - wall0,
                "first_chunk_cpu_s": cpu1 - cpu0,
                "phases_s": {"stage1": round(stage1 - wall0, 3), "refiner_and_decode": round(wall1 - stage1, 3)},
                "frames": uint8.reshape(-1, *uint8.shape[-3:])}


def measure(folder: Path, size: tuple[int, int, int, int], rounds: int, max_wait: float) -> dict[str, Any]:
    engines = {"vidloom": Vidloom(folder), "reference": Reference(folder)}
    for engine in engines.values():
        engine.run(size, steps=1)  # warm-up: first-call allocations and lazy imports, not timed
    rows, last = [], {}
    for round_ in range(rounds):
        for name in ENGINES if round_ % 2 == 0 else ENGINES[::-1]:
            machine = wb.before_run(max_wait)
            result = engines[name].run(size)
            last[name] = result.pop("frames")
            rows.append({"round": round_, "engine": name, **machine,
                         **{k: round(v, 4) if isinstance(v, float) else v for k, v in result.items()}})
            print(f"round {round_} {name:>9}: first chunk {result['first_chunk_s']:.2f} s, "
                  f"total {result['total_s']:.2f} s (load {machine['loadavg_1m']:.2f})", file=sys.stderr, flush=True)
    ours, theirs = last["vidloom"], last["reference"]
    diff = np.abs(ours.astype(int) - theirs.astype(int)) if ours.shape == theirs.shape else None
    return {"rows": rows, "frames": {"shape": list(ours.shape), "reference_shape": list(theirs.shape),
                                     "max_uint8_levels": None if diff is None else int(diff.max())}}


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per engine the median of the rounds; the reference's end to end over vidloom's first chunk and total."""
    keys = ("first_chunk_s", "total_s", "first_chunk_cpu_s", "total_cpu_s")
    med = {name: {k: round(statistics.median(r[k] for r in rows if r["engine"] == name), 4) for k in keys}
           for name in ENGINES}
    # Stage 1, approximately: vidloom's stage-1 denoise steps (its progress events), the reference's whole
    # SanaWMPipeline call (text and image encode too); the rest of each total is the refiner and the decode.
    for name in ENGINES:
        med[name]["stage1_s"] = round(statistics.median(r["phases_s"].get("stage1", 0.0) for r in rows
                                                        if r["engine"] == name), 4)
    ref, ours = med["reference"], med["vidloom"]
    return {
        "median": med,
        "reference_total_over_vidloom_first_chunk": round(ref["total_s"] / ours["first_chunk_s"], 2),
        "reference_total_over_vidloom_first_chunk_cpu": round(ref["total_cpu_s"] / ours["first_chunk_cpu_s"], 2),
        "reference_total_over_vidloom_total": round(ref["total_s"] / ours["total_s"], 2),
        "reference_total_over_vidloom_total_cpu": round(ref["total_cpu_s"] / ours["total_cpu_s"], 2),
        "vidloom_first_chunk_over_total": round(ours["first_chunk_s"] / ours["total_s"], 3),
        "loadavg_1m_mean": round(statistics.mean(r["loadavg_1m"] for r in rows), 2),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = wb.parser(__doc__, max_wait=5.0, per="run")
    parser.add_argument("--rounds", type=int, default=3, help="timed runs per engine (median kept)")
    parser.add_argument("--frames", type=int, default=None, help="video frames (default: 81 mid, 41 tiny)")
    args = parser.parse_args(argv)
    wb.one_thread(float32=True)  # the reference's dtype: the frames compare (the card's is float32 too)
    scale = "tiny" if args.tiny else "mid"
    height, width, frames, steps = SIZES[scale]
    size = (height, width, args.frames or frames, steps)
    folder = _checkpoint(args.tiny, args.cache)
    started, env = wb.start()
    result = measure(folder, size, args.rounds, wb.max_wait_of(args, 5.0))
    summary = summarize(result["rows"])
    print_table(["engine", "first chunk s (CPU)", "total s (CPU)"],
                [[n, f"{summary['median'][n]['first_chunk_s']:.2f} ({summary['median'][n]['first_chunk_cpu_s']:.2f})",
                  f"{summary['median'][n]['total_s']:.2f} ({summary['median'][n]['total_cpu_s']:.2f})"]
                 for n in ENGINES])
    print(json.dumps({k: v for k, v in summary.items() if k != "median"}, indent=1))
    spec = SANA_WM_A if args.tiny else MID
    config = {"scale": scale, "transformer": spec.transformer, "refiner": spec.refiner, "vae": spec.vae.name,
              "height": height, "width": width, "frames": size[2], "stage1_steps": steps,
              "refiner_settings": "the refiner's defaults (sink 1, 3-latent-frame chunks, 11-frame window, 3 steps)",
              "camera": CAMERA, "guidance": GUIDANCE, "dtype": "float32", "torch_threads": 1, "rounds": args.rounds}
    return wb.save(args.out or f"sana_wm-{scale}-cpu.json",
                   "SANA-WM two-stage: vidloom time to first refined chunk and total vs SanaWMPipeline + "
                   "SanaWMLTX2Refiner end to end", config, env, summary, result, started)


if __name__ == "__main__":
    main()
