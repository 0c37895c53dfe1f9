"""Speech before/after the talker moved onto the paged KV pool: time to first audio and RTF at 1 and 8 concurrent
requests, each code version in fresh processes that alternate (A, B, A, B...), the load average recorded per run.

    OMP_NUM_THREADS=1 python bench/speech_talker_batch.py --before DIR [--size mid] [--audio-tokens 100] [--rounds 2]

`--before DIR` is an export of the commit before (`git archive <sha> | tar -x -C DIR`); "after" is this tree.
Each variant is (code, scheduling policy): before/fifo is what bench/speech.py measured until now (fifo runs
concurrent speech requests one after another), before/interleave gives every request turns but runs each talker
step alone, after/interleave batches the talker steps of every request in one paged forward. Greedy, every
utterance --audio-tokens codes long (a random talker otherwise stops anywhere), whole and streamed
(audio_chunk_codes=25, the server's first chunk). vidloom only: transformers' numbers are bench/speech.py's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = (("before", "fifo"), ("before", "interleave"), ("after", "interleave"))
CONCURRENCY = (1, 8)
STREAM_CHUNK_CODES = 25  # vidloom.serving.speech_stream.STREAM_CHUNK_CODES (both versions)


def worker(args: argparse.Namespace) -> None:
    """One process on one code version: every (concurrency, whole/streamed) once after a warm-up; JSON line."""
    if args.tree:  # import vidloom (and the test helpers) from the other tree, this tree's bench modules after it
        sys.path[:0] = [args.tree, str(ROOT)]
    import torch

    sys.path.insert(1, str(ROOT / "bench"))
    from speech import VidloomSpeech, _checkpoint  # after the path is set

    torch.set_num_threads(1)
    side = VidloomSpeech(_checkpoint(args.size), args.thinker_tokens, args.audio_tokens, to_cap=True,
                         policy=args.policy)
    out: dict[str, dict[str, float]] = {}
    try:
        side.run(1, None)  # warm-up
        for n in CONCURRENCY:
            for mode, chunk in (("whole", None), ("streamed", STREAM_CHUNK_CODES)):
                load = os.getloadavg()[0]
                out[f"{mode}_{n}"] = {**side.run(n, chunk), "loadavg_1m": load}
    finally:
        side.close()
    print(json.dumps(out))


def run_variant(args: argparse.Namespace, code: str, policy: str) -> dict[str, dict[str, float]]:
    command = [sys.executable, __file__, "--worker", "--policy", policy, "--size", args.size,
               "--thinker-tokens", str(args.thinker_tokens), "--audio-tokens", str(args.audio_tokens)]
    if code == "before":
        command += ["--tree", args.before]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{code}/{policy} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", help="an export of the commit before (required unless --worker)")
    parser.add_argument("--size", default="mid")
    parser.add_argument("--thinker-tokens", type=int, default=16)
    parser.add_argument("--audio-tokens", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default=None)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tree", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--policy", default="interleave", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    if not args.before:
        parser.error("--before DIR is required")
    sys.path.insert(0, str(ROOT / "bench"))
    from report import environment, print_table, write_json

    runs: dict[str, list] = {f"{code}/{policy}": [] for code, policy in VARIANTS}
    for _ in range(args.rounds):
        for code, policy in VARIANTS:
            runs[f"{code}/{policy}"].append(run_variant(args, code, policy))
            print(code, policy, json.dumps(runs[f"{code}/{policy}"][-1]), flush=True)
    medians = {name: {key: {m: statistics.median(r[key][m] for r in rs) for m in rs[0][key]} for key in rs[0]}
               for name, rs in runs.items()}
    rows = [[name, key, f"{m['rtf']:.2f}", f"{m['first_audio_mean_s']:.2f}", f"{m['first_audio_min_s']:.2f}",
             f"{m['wall_s']:.2f}", f"{m['loadavg_1m']:.1f}"] for name, by in medians.items() for key, m in by.items()]
    print_table(["variant", "setting", "RTF", "first audio mean s", "first audio min s", "wall s", "load"], rows)
    after, before = medians["after/interleave"], medians["before/interleave"]
    ratios = {key: {"after_vs_before_interleave_rtf": after[key]["rtf"] / before[key]["rtf"],
                    "after_vs_before_interleave_first_audio_mean":
                        after[key]["first_audio_mean_s"] / before[key]["first_audio_mean_s"],
                    "after_interleave_vs_before_fifo_first_audio_mean":
                        after[key]["first_audio_mean_s"] / medians["before/fifo"][key]["first_audio_mean_s"]}
              for key in after}
    for n in CONCURRENCY:
        ratios[f"after_streamed_vs_whole_first_audio_mean_{n}"] = (
            after[f"streamed_{n}"]["first_audio_mean_s"] / after[f"whole_{n}"]["first_audio_mean_s"])
    write_json(args.out or f"speech-talker-batch-{args.size}-cpu.json", {
        "environment": environment(), "size": args.size, "thinker_tokens": args.thinker_tokens,
        "audio_tokens": args.audio_tokens, "to_cap": True, "stream_chunk_codes": STREAM_CHUNK_CODES,
        "rounds": args.rounds, "interleaved": True, "variants": [f"{c}/{p}" for c, p in VARIANTS],
        "medians": medians, "ratios": ratios, "runs": runs})


if __name__ == "__main__":
    main()
