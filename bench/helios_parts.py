"""Helios' two costs, vidloom vs diffusers in one process: one chunk's VAE decode and one denoiser forward.

The side-by-side report (`bench/report.py --families helios-mid`) times whole generations, a few minutes per
setting; this isolates the two parts on the same helios-mid checkpoint (bench/family_bench.py: a 6-layer DiT of
8 heads x 64 and a Wan VAE of base_dim 16, 128 x 128 frames, 9-latent-frame chunks), with the same weights and
inputs on both sides, float32:

- decode: one chunk's normalised latents [1, 16, 9, 16, 16] -> 33 frames in [0, 1], as each side's chunk loop
  does it (vidloom.families.helios.loop.decode_chunk; HeliosPipeline's denormalise + AutoencoderKLWan.decode).
- step: one transformer forward of a chunk with its long / mid / short history (the pipeline's history sizes and
  frame indices; a prompt of 16 tokens zero-padded to 512, as the pipeline pads it): the conditional branch of
  one CFG step. vidloom's text keys/values are prepared once per prompt, as its chunk loop prepares them;
  diffusers projects the text at every forward.

Rounds interleave the sides (the order flips every round) so load hits them alike; medians of CPU and wall
seconds are reported with os.getloadavg() before and after each measurement (the machine is shared). `--profile`
prints each side's torch.profiler table of one call.

    python bench/helios_parts.py [--parts decode,step] [--rounds 5] [--threads 1] [--profile]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
for _path in (str(ROOT), str(ROOT / "bench")):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import torch  # noqa: E402

from family_bench import FAMILIES  # noqa: E402
from report import environment, print_table, write_json  # noqa: E402

FAMILY = "helios-mid"
TEXT_TOKENS = 512  # HeliosPipeline.__call__'s max_sequence_length: the prompt embeddings are zero-padded to it
PROMPT_TOKENS = 16
Call = Callable[[], torch.Tensor]


def _sides(folder: Path) -> tuple[Any, Any]:
    """(vidloom's instance components, diffusers' HeliosPipeline), both float32 on the CPU."""
    import diffusers

    from vidloom.generator import VideoGenerator

    ours = VideoGenerator.from_pretrained(folder, device="cpu", dtype="float32").engine.instance.components
    pipe = diffusers.HeliosPipeline.from_pretrained(str(folder), dtype=torch.float32)
    return ours, pipe


def decode_calls(ours: dict[str, Any], pipe: Any, latent_hw: tuple[int, int]) -> tuple[Call, Call]:
    """One chunk's decode on each side, from the same normalised latents."""
    from vidloom.families.helios.loop import CHUNK_LATENT_FRAMES, decode_chunk

    vae = pipe.vae
    seeded = torch.Generator().manual_seed(0)
    latents = torch.randn(1, vae.config.z_dim, CHUNK_LATENT_FRAMES, *latent_hw, generator=seeded)
    shape = (1, vae.config.z_dim, 1, 1, 1)
    mean = torch.tensor(vae.config.latents_mean).view(shape)
    inv_std = 1.0 / torch.tensor(vae.config.latents_std).view(shape)

    def reference() -> torch.Tensor:  # HeliosPipeline's per-chunk decode, then its [0, 1] frames
        video = vae.decode(latents / inv_std + mean, return_dict=False)[0]
        return (video[0] * 0.5 + 0.5).clamp(0, 1).permute(1, 2, 3, 0)

    return (lambda: decode_chunk(ours["vae"], latents)), reference


def step_calls(ours: dict[str, Any], pipe: Any, latent_hw: tuple[int, int]) -> tuple[Call, Call]:
    """One denoiser forward on each side: a chunk with its three history terms, at a mid-schedule timestep."""
    from vidloom.families.helios.loop import CHUNK_LATENT_FRAMES, HISTORY_SIZES, frame_indices
    from vidloom.families.helios.transformer import HeliosHistory

    gen = torch.Generator().manual_seed(1)
    ref = pipe.transformer
    channels, text_dim = ref.config.in_channels, ref.config.text_dim
    long, mid, short = HISTORY_SIZES
    latents = torch.randn(1, channels, CHUNK_LATENT_FRAMES, *latent_hw, generator=gen)
    history = [torch.randn(1, channels, frames, *latent_hw, generator=gen) for frames in (long, mid, 1 + short)]
    text = torch.zeros(1, TEXT_TOKENS, text_dim)
    text[:, :PROMPT_TOKENS] = torch.randn(1, PROMPT_TOKENS, text_dim, generator=gen)
    timestep = torch.tensor([617.0])
    i_chunk, i_short, i_mid, i_long = frame_indices()
    model = ours["transformer"]
    prompt = model.prepare_prompt(text)  # once per prompt in the chunk loop (PreparedPrompts)
    bound = HeliosHistory(history[2], i_short, history[1], i_mid, history[0], i_long)

    def reference() -> torch.Tensor:
        return ref(hidden_states=latents, timestep=timestep, encoder_hidden_states=text,
                   indices_hidden_states=i_chunk[None], indices_latents_history_short=i_short[None],
                   indices_latents_history_mid=i_mid[None], indices_latents_history_long=i_long[None],
                   latents_history_short=history[2], latents_history_mid=history[1],
                   latents_history_long=history[0], return_dict=False)[0]

    return (lambda: model(latents, timestep, prompt, i_chunk, bound)), reference


def _time(call: Call) -> dict[str, float]:
    load = os.getloadavg()[0]
    cpu, wall = time.process_time(), time.perf_counter()
    with torch.inference_mode():
        call()
    return {"cpu_s": time.process_time() - cpu, "wall_s": time.perf_counter() - wall,
            "load_before": round(load, 2), "load_after": round(os.getloadavg()[0], 2)}


def measure(calls: dict[str, tuple[Call, Call]], rounds: int) -> dict[str, Any]:
    """Per part: max |ours - reference|, then `rounds` interleaved timings of each side (order flipped each round)."""
    out: dict[str, Any] = {}
    for part, (ours, reference) in calls.items():
        with torch.inference_mode():
            diff = (ours().float() - reference().float()).abs().max().item()  # also the warm-up call
        samples: dict[str, list[dict[str, float]]] = {"vidloom": [], "diffusers": []}
        for index in range(rounds):
            order = [("vidloom", ours), ("diffusers", reference)]
            for side, call in order if index % 2 == 0 else order[::-1]:
                samples[side].append(_time(call))
        summary = {side: {key: round(statistics.median(s[key] for s in runs), 4) for key in ("cpu_s", "wall_s")}
                   for side, runs in samples.items()}
        out[part] = {"max_abs_diff": diff, **summary,
                     "speedup_cpu": round(summary["diffusers"]["cpu_s"] / summary["vidloom"]["cpu_s"], 2),
                     "speedup_wall": round(summary["diffusers"]["wall_s"] / summary["vidloom"]["wall_s"], 2),
                     "loads": sorted(s["load_before"] for runs in samples.values() for s in runs), "samples": samples}
    return out


def profile(calls: dict[str, tuple[Call, Call]], rows: int = 18) -> None:
    from torch.profiler import profile as torch_profile

    for part, pair in calls.items():
        for side, call in zip(("vidloom", "diffusers"), pair):
            with torch.inference_mode(), torch_profile() as prof:
                call()
            print(f"\n== {part}: {side}")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default="decode,step", help="comma-separated: decode, step")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--profile", action="store_true", help="print a torch.profiler table per side instead")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    bench = FAMILIES[FAMILY]
    ours, pipe = _sides(bench.checkpoint())
    factor = pipe.vae_scale_factor_spatial
    latent_hw = (bench.request["height"] // factor, bench.request["width"] // factor)
    makers = {"decode": decode_calls, "step": step_calls}
    calls = {part: makers[part](ours, pipe, latent_hw) for part in args.parts.split(",")}
    if args.profile:
        profile(calls)
        return 0
    report(measure(calls, args.rounds), "helios_parts", FAMILY, args.rounds, args.threads)
    return 0


def report(results: dict[str, Any], name: str, family: str, rounds: int, threads: int) -> None:
    """Print measure()'s results as a table and save them as bench/results/{name}-t{threads}.json."""
    print_table(["part", "max |diff|", "vidloom CPU s", "diffusers CPU s", "speed-up CPU / wall", "load 1m"],
                [[part, f"{r['max_abs_diff']:.2e}", r["vidloom"]["cpu_s"], r["diffusers"]["cpu_s"],
                  f"{r['speedup_cpu']}x / {r['speedup_wall']}x", f"{r['loads'][0]}-{r['loads'][-1]}"]
                 for part, r in results.items()])
    write_json(f"{name}-t{threads}.json", {"environment": environment(), "family": family, "rounds": rounds,
                                           "threads": threads, "parts": results})


if __name__ == "__main__":
    raise SystemExit(main())
