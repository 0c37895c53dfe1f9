"""Cosmos3 generation: vidloom's cached text prefix vs diffusers' Cosmos3OmniPipeline (whole prompt every step).

Each (configuration, prompt length) runs in a fresh subprocess (comparable peak RSS) on a mid-size
random-weight checkpoint written by diffusers. A process loads the model, warms up on a 1-step
request, then times a generation to latents (tokenize, noise, prefix prefill, every step; no VAE
decode, the same Wan VAE for all). Per-step time is the mean over the denoise steps. Configurations:
vidloom (prefix prefilled once per CFG branch), vidloom-recompute (the prefix re-run at every step,
as the pipeline does), diffusers. The FLOP ratio is computed from the token counts of the two schedules.

    OMP_NUM_THREADS=1 python bench/cosmos3_prefix.py [--prompt-words 40,400] [--steps 8]
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from checkpoints import cached
from report import environment, print_table, run_worker, write_json

from tests.helpers.cosmos3_checkpoints import TinyCosmos3, write_tiny_cosmos3  # noqa: E402

MID = TinyCosmos3(
    name="cosmos3-mid",
    transformer=dict(hidden_size=256, head_dim=32, num_attention_heads=8, num_key_value_heads=4,
                     intermediate_size=768, num_hidden_layers=6, rope_theta=5000000.0, rope_axes_dim=(6, 5, 5),
                     latent_channel=4, patch_latent_dim=16, rms_norm_eps=1e-6),
)
HEIGHT, WIDTH, FRAMES, GUIDANCE, SEED = 128, 128, 17, 4.0, 0
WORDS = "a red fox jumps over the lazy dog in the snow while the quick brown fox watches".split()
CONFIGS = ("vidloom", "vidloom-recompute", "diffusers")


def _checkpoint() -> Path:
    return cached(MID.name, lambda folder: write_tiny_cosmos3(folder, MID))


def _prompt(words: int) -> str:
    return " ".join(WORDS[i % len(WORDS)] for i in range(words))


# -- worker: one configuration and prompt length, one process -------------------------------------


def _run_vidloom(folder: Path, prompt: str, steps: int, cache_prefix: bool) -> dict[str, Any]:
    from vidloom.core.program import Program
    from vidloom.core.request import GenerationRequest
    from vidloom.generator import VideoGenerator
    from vidloom.families.cosmos3.gen_program import generation_nodes
    from vidloom.families.cosmos3.program import build_program
    from vidloom.runtime.engine import Engine

    instance = VideoGenerator.from_pretrained(folder, device="cpu").engine.instance
    nodes = tuple(n for n in generation_nodes(instance, build_program(instance).chat_loop, cache_prefix=cache_prefix)
                  if n.name not in ("decode", "decode_sound", "silent"))
    engine = Engine(instance, Program(nodes=nodes, inputs=frozenset({"request"}), outputs=("latents", "branches")))

    def request(n: int) -> GenerationRequest:
        return GenerationRequest(prompt, height=HEIGHT, width=WIDTH, num_frames=FRAMES, num_inference_steps=n,
                                 guidance_scale=GUIDANCE, seed=SEED)

    engine.run(request(1))
    steps_s: list[float] = []
    start, cpu = time.perf_counter(), time.process_time()
    out = engine.run(request(steps), on_event=lambda e: getattr(e, "phase", "") == "denoise" and steps_s.append(e.seconds))
    branches = out["branches"]
    return {"total_s": time.perf_counter() - start, "total_cpu_s": time.process_time() - cpu,
            "step_s": sum(steps_s) / len(steps_s),
            "prefix_tokens": [len(ids) for ids, _ in branches], "gen_tokens": branches[0][1].tokens}


def _run_diffusers(folder: Path, prompt: str, steps: int) -> dict[str, Any]:
    import torch
    from diffusers import Cosmos3OmniPipeline

    pipe = Cosmos3OmniPipeline.from_pretrained(folder, enable_safety_checker=False)
    pipe.set_progress_bar_config(disable=True)
    marks: list[float] = []

    def run(n: int) -> None:
        marks.clear()
        marks.append(time.perf_counter())
        pipe(prompt, num_frames=FRAMES, height=HEIGHT, width=WIDTH, num_inference_steps=n, guidance_scale=GUIDANCE,
             generator=torch.Generator("cpu").manual_seed(SEED), output_type="latent", enable_safety_check=False,
             callback_on_step_end=lambda p, i, t, kw: (marks.append(time.perf_counter()), kw)[1])

    run(1)
    start, cpu = time.perf_counter(), time.process_time()
    run(steps)
    per_step = [b - a for a, b in zip(marks[1:], marks[2:], strict=False)]  # after the first (includes setup)
    return {"total_s": time.perf_counter() - start, "total_cpu_s": time.process_time() - cpu,
            "step_s": sum(per_step) / max(1, len(per_step))}


def worker(config: str, words: int, steps: int) -> None:
    import torch

    torch.manual_seed(0)
    folder, prompt = _checkpoint(), _prompt(words)
    if config == "diffusers":
        result = _run_diffusers(folder, prompt, steps)
    else:
        result = _run_vidloom(folder, prompt, steps, cache_prefix=config == "vidloom")
    result["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(result))


# -- FLOPs from token counts ----------------------------------------------------------------------


def step_flops(prefix: int, gen: int, cached: bool) -> float:
    """Multiply-adds x2 of one denoise step of one branch through the layers (linears and attention).

    Recompute (the pipeline): the prefix's tokens go through the text linears and causal attention
    again, and the generated tokens attend to prefix + themselves. Cached: only the generated tokens.
    """
    c = MID.transformer
    h, d, heads, kv, inter = (c["hidden_size"], c["head_dim"], c["num_attention_heads"], c["num_key_value_heads"],
                              c["intermediate_size"])
    per_token = 2 * (2 * h * heads * d + 2 * h * kv * d + 3 * h * inter)  # q,o + k,v + gated MLP
    attention_gen = 4 * gen * (prefix + gen) * heads * d  # scores and weighted sum
    flops = gen * per_token + attention_gen
    if not cached:
        flops += prefix * per_token + 4 * (prefix * (prefix + 1) / 2) * heads * d
    return c["num_hidden_layers"] * flops


def flop_saving(prefixes: list[int], gen: int, steps: int) -> float:
    """Pipeline FLOPs over ours for a whole run (ours pays one prefill per branch)."""
    ours = sum(steps * step_flops(p, gen, True) + step_flops(p, 0, False) for p in prefixes)
    theirs = sum(steps * step_flops(p, gen, False) for p in prefixes)
    return theirs / ours


# -- driver ---------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompt-words", default="40,400")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--max-wait", type=float, default=60.0, help="seconds to wait for a quiet machine per run")
    parser.add_argument("--worker", nargs=3, metavar=("CONFIG", "WORDS", "STEPS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker[0], int(args.worker[1]), int(args.worker[2]))
        return
    _checkpoint()
    rows: list[dict[str, Any]] = []
    for words in (int(w) for w in args.prompt_words.split(",")):
        for config in args.configs.split(","):
            result = run_worker(__file__, [config, str(words), str(args.steps)], args.max_wait)
            rows.append({"config": config, "prompt_words": words, **result})
            print(f"{config:>18} words={words:<4} {result}", file=sys.stderr)
    _report(rows, args.steps)


def _report(rows: list[dict[str, Any]], steps: int) -> None:
    by = {(r["config"], r["prompt_words"]): r for r in rows}
    summary, table = [], []
    for words in sorted({r["prompt_words"] for r in rows}):
        ours = by[("vidloom", words)]
        entry: dict[str, Any] = {"prompt_words": words, "prefix_tokens": ours["prefix_tokens"],
                                 "gen_tokens": ours["gen_tokens"],
                                 "flops_pipeline_over_cached": round(flop_saving(ours["prefix_tokens"],
                                                                                 ours["gen_tokens"], steps), 2)}
        for key in ("vidloom-recompute", "diffusers"):
            if (key, words) in by:
                other = by[(key, words)]
                entry[f"{key}_over_vidloom_step"] = round(other["step_s"] / ours["step_s"], 2)
                entry[f"{key}_over_vidloom_total"] = round(other["total_s"] / ours["total_s"], 2)
                # CPU time: less disturbed than wall time by other work on a shared machine.
                entry[f"{key}_over_vidloom_total_cpu"] = round(other["total_cpu_s"] / ours["total_cpu_s"], 2)
                entry[f"{key}_over_vidloom_rss"] = round(other["peak_rss_mib"] / ours["peak_rss_mib"], 2)
        summary.append(entry)
        for r in rows:
            if r["prompt_words"] == words:
                table.append([r["config"], str(words), f"{r['step_s'] * 1e3:.1f}", f"{r['total_s']:.2f}",
                              f"{r['peak_rss_mib']:.0f}"])
    print_table(["config", "prompt words", "step ms", "total s", "peak RSS MiB"], table)
    print(json.dumps(summary, indent=1))
    write_json("cosmos3_prefix-mid-cpu.json", {
        "what": "Cosmos3 generation to latents, cached text prefix vs recompute vs Cosmos3OmniPipeline",
        "config": {"model": MID.transformer, "height": HEIGHT, "width": WIDTH, "frames": FRAMES, "steps": steps,
                   "guidance": GUIDANCE},
        "environment": environment(), "rows": rows, "summary": summary,
    })


if __name__ == "__main__":
    main()
