"""Acceleration of the AR decoders on CPU: Qwen2.5-Omni (bench/speech.py's mid-size random config) plain vs fp8 /
compile / the math attention kernel, for a greedy chat (prefill + decode through the paged pool) and a spoken
reply (thinker, talker, token2wav, vocoder). Settings interleave (A, B, C, ..., A, B, C, ...) so machine load hits
them alike; medians and ratios to plain are reported with os.getloadavg() before and after every measurement.

    OMP_NUM_THREADS=1 python bench/decoder_accel.py [--rounds 3] [--inductor] [--device cuda]

On CPU FP8 saves weight memory but not time (each weight is dequantized before its matmul: FP8 matmuls need a
GPU of compute capability >= 8.9), and aot_eager compiles without generating kernels: both ratios measure the
overhead of the path, not its speed-up on a GPU. `--inductor` adds inductor's CPU kernels (minutes to compile).
`--device cuda` runs every setting on the GPU and adds "cuda graphs" (the paged decode step replayed per batch
bucket, runtime.decode_graphs); results go to decoder_accel-mid-cuda.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from checkpoints import cached  # noqa: E402
from report import environment, print_table, write_json  # noqa: E402
from speech import SIZES  # noqa: E402
from tests.helpers.qwen_omni_checkpoints import write_tiny_omni  # noqa: E402
from vidloom.core.deploy import DeployConfig  # noqa: E402
from vidloom.generator import VideoGenerator  # noqa: E402

SETTINGS: dict[str, dict[str, Any]] = {
    "plain": {}, "fp8": dict(fp8_weights=True), "compile aot_eager": dict(compile=True, compile_backend="aot_eager"),
    "math attention": dict(attention_backend="math"),
}
CHAT_TOKENS = 32
AUDIO_TOKENS = 50
MESSAGES = [{"role": "user", "content": "tell me about kites in one sentence please"}]


def _checkpoint() -> Path:
    spec = SIZES["mid"]
    return cached(spec.name, lambda folder: write_tiny_omni(folder, spec), marker="spk_dict.pt")


def _chat(gen: VideoGenerator) -> tuple[float, tuple[int, ...]]:
    start = time.perf_counter()
    result = gen.chat(MESSAGES, temperature=0.0, max_tokens=CHAT_TOKENS)
    return time.perf_counter() - start, tuple(result.token_ids)


def _speak(gen: VideoGenerator) -> tuple[float, int]:
    start = time.perf_counter()
    result = gen.speak("The kite rose over the dunes.", voice="Ethan", seed=1, max_audio_tokens=AUDIO_TOKENS,
                       greedy=True)
    return time.perf_counter() - start, result.audio_tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--inductor", action="store_true", help="also compile with inductor (CPU kernels)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args()
    settings = dict(SETTINGS)
    if args.inductor:
        settings["compile inductor"] = dict(compile=True, compile_backend="inductor")
    if args.device == "cuda":
        settings["cuda graphs"] = dict(cuda_graphs=True)
    folder = _checkpoint()
    gens = {name: VideoGenerator.from_pretrained(folder, device=args.device, dtype="float32",
                                                 deploy=DeployConfig(**deploy)) for name, deploy in settings.items()}
    for gen in gens.values():  # warm: compile, allocate, first-touch
        _chat(gen), _speak(gen)
    runs: list[dict[str, Any]] = []
    for round_ in range(args.rounds):
        for name, gen in gens.items():
            load_before = os.getloadavg()
            chat_s, ids = _chat(gen)
            speak_s, codes = _speak(gen)
            runs.append(dict(round=round_, setting=name, chat_s=chat_s, speak_s=speak_s, chat_tokens=len(ids),
                             audio_tokens=codes, token_ids=list(ids), load_before=load_before,
                             load_after=os.getloadavg()))
    plain_ids = next(r["token_ids"] for r in runs if r["setting"] == "plain")
    summary = {}
    for name in settings:
        mine = [r for r in runs if r["setting"] == name]
        summary[name] = dict(chat_s=statistics.median(r["chat_s"] for r in mine),
                             speak_s=statistics.median(r["speak_s"] for r in mine),
                             same_ids_as_plain=all(r["token_ids"] == plain_ids for r in mine))
    for name, row in summary.items():
        row["chat_ratio_to_plain"] = row["chat_s"] / summary["plain"]["chat_s"]
        row["speak_ratio_to_plain"] = row["speak_s"] / summary["plain"]["speak_s"]
    print_table(["setting", "chat s", "x plain", "speak s", "x plain", "same ids"],
                [[n, f"{r['chat_s']:.3f}", f"{r['chat_ratio_to_plain']:.2f}", f"{r['speak_s']:.3f}",
                  f"{r['speak_ratio_to_plain']:.2f}", str(r["same_ids_as_plain"])] for n, r in summary.items()])
    write_json(f"decoder_accel-mid-{args.device}.json", dict(
        environment=environment(), config=SIZES["mid"].name, chat_tokens=CHAT_TOKENS, audio_tokens=AUDIO_TOKENS,
        threads=torch.get_num_threads(), rounds=args.rounds, summary=summary, runs=runs,
        graph_stats=gens["cuda graphs"].engine.graph_stats if "cuda graphs" in gens else None))


if __name__ == "__main__":
    main()
