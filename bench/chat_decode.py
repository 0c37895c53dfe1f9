"""Chat decode: tokens/s at 1, 4 and 16 concurrent requests, vidloom vs transformers' `generate`, TTFT, peak RSS.

One random-weight Cosmos3 Omni checkpoint (a mid-sized text pathway, written by diffusers), the
same weights in both: vidloom's AsyncEngine.chat (paged KV, continuous batching: the N requests
are submitted together and decode as one batch), and transformers'
Cosmos3OmniForConditionalGeneration.generate on the same N prompts as one left-padded batch
(static batching: what `generate` offers). Greedy decoding, `--max-tokens` new tokens per request;
tokens/s counts the tokens each request really produced (a sequence that meets EOS stops early in
vidloom; in transformers it keeps computing padding, which is its cost, not ours to hide).
Time to first token: vidloom, from submission to each request's first token (mean over the N);
transformers, a `generate(max_new_tokens=1)` of the same batch. Each (system, concurrency) runs in a
fresh subprocess after a warm-up request, so peak RSS is per configuration.

    python bench/chat_decode.py [--concurrency 1,4,16] [--max-tokens 64] [--systems vidloom,transformers]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from report import environment, print_table, wait_for_quiet, write_json  # noqa: E402
from tests.helpers.cosmos3_checkpoints import TinyCosmos3, write_tiny_cosmos3  # noqa: E402

CACHE = ROOT / "bench" / ".cache"
# Mid-sized text pathway (~25M parameters in it; the generation pathway doubles the file): large enough
# that a decode step is matrix work rather than Python overhead, small enough for a 2-core CPU.
MID = TinyCosmos3(
    name="cosmos3-mid",
    transformer=dict(hidden_size=512, head_dim=64, num_attention_heads=8, num_key_value_heads=4,
                     intermediate_size=1536, num_hidden_layers=6, rope_theta=5000000.0, rope_axes_dim=(16, 8, 8),
                     latent_channel=4, patch_latent_dim=16, rms_norm_eps=1e-6),
)
SYSTEMS = ("vidloom", "transformers")
PROMPTS = (
    "tell me a story about robots",
    "what is in this picture? a red fox jumps over the lazy dog in the snow",
    "cosmos predicts the future of the physical world. the quick brown fox",
    "hello world! 1 2 3 4 5 6 7 8 9 0",
)


def _checkpoint() -> Path:
    folder = CACHE / MID.name
    if not (folder / "model_index.json").exists():
        write_tiny_cosmos3(folder, MID)
    return folder


def _messages(i: int) -> list[dict[str, str]]:
    """Request i's conversation: prompts of different lengths, so the batch is ragged."""
    text = " ".join(PROMPTS[j % len(PROMPTS)] for j in range(i % 3 + 1))
    return [{"role": "system", "content": "you are a helpful assistant"}, {"role": "user", "content": f"{i}: {text}"}]


# -- workers: one system and concurrency per process ---------------------------------------------


def _run_vidloom(folder: Path, n: int, max_tokens: int) -> dict[str, float]:
    import asyncio

    from vidloom.core.chat import ChatRequest, ChatResult, SamplingParams, messages_from_openai
    from vidloom.generator import VideoGenerator
    from vidloom.runtime.async_engine import AsyncEngine

    engine = AsyncEngine(VideoGenerator.from_pretrained(folder, device="cpu").engine)

    async def one(i: int, tokens: int) -> tuple[float, int]:
        request = ChatRequest(messages_from_openai(_messages(i)), SamplingParams(max_tokens=tokens, temperature=0.0))
        start, first = time.perf_counter(), None
        async for item in engine.chat(request):
            if first is None:
                first = time.perf_counter() - start
            if isinstance(item, ChatResult):
                return first or 0.0, item.completion_tokens
        raise RuntimeError("no result")

    async def run(tokens: int) -> tuple[float, list[tuple[float, int]]]:
        start = time.perf_counter()
        results = await asyncio.gather(*(one(i, tokens) for i in range(n)))
        return time.perf_counter() - start, results

    try:
        asyncio.run(run(4))  # warm-up
        wall, results = asyncio.run(run(max_tokens))
    finally:
        engine.close()
    tokens = sum(r[1] for r in results)
    return {"wall_s": wall, "tokens": tokens, "tokens_per_s": tokens / wall,
            "ttft_s": sum(r[0] for r in results) / n}


def _run_transformers(folder: Path, n: int, max_tokens: int) -> dict[str, float]:
    import torch
    from diffusers import Cosmos3OmniTransformer
    from transformers import AutoTokenizer

    from tests.helpers.cosmos3_checkpoints import build_reasoner

    tokenizer = AutoTokenizer.from_pretrained(folder / "text_tokenizer")
    tokenizer.padding_side = "left"
    model = build_reasoner(Cosmos3OmniTransformer.from_pretrained(folder / "transformer").eval(), tokenizer)
    texts = [tokenizer.apply_chat_template(_messages(i), tokenize=False, add_generation_prompt=True) for i in range(n)]
    batch = tokenizer(texts, return_tensors="pt", padding=True)

    def generate(tokens: int) -> torch.Tensor:
        with torch.inference_mode():
            return model.generate(**batch, max_new_tokens=tokens, do_sample=False)

    generate(4)  # warm-up
    start = time.perf_counter()
    generate(1)
    ttft = time.perf_counter() - start
    start = time.perf_counter()
    out = generate(max_tokens)
    wall = time.perf_counter() - start
    new = out[:, batch["input_ids"].shape[1]:]
    tokens = sum(_until_eos(row.tolist(), tokenizer.eos_token_id) for row in new)
    return {"wall_s": wall, "tokens": tokens, "tokens_per_s": tokens / wall, "ttft_s": ttft}


def _until_eos(ids: list[int], eos: int) -> int:
    """Tokens a request really produced: up to and including EOS (what vidloom counts too)."""
    return ids.index(eos) + 1 if eos in ids else len(ids)


def worker(system: str, n: int, max_tokens: int, threads: int) -> None:
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(threads)
    folder = _checkpoint()
    run = _run_vidloom if system == "vidloom" else _run_transformers
    result: dict[str, Any] = run(folder, n, max_tokens)
    result["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(result))


# -- driver ---------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", default="1,4,16")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--max-wait", type=float, default=60.0, help="seconds to wait for a quiet machine per run")
    # One thread by default: on a shared CPU, OpenMP threads spin-waiting on each other distort both
    # systems (transformers far more), which says nothing about either.
    parser.add_argument("--threads", type=int, default=1, help="torch threads in each worker")
    parser.add_argument("--worker", nargs=4, metavar=("SYSTEM", "N", "MAX_TOKENS", "THREADS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker[0], int(args.worker[1]), int(args.worker[2]), int(args.worker[3]))
        return
    _checkpoint()
    rows: list[dict[str, Any]] = []
    for n in (int(c) for c in args.concurrency.split(",")):
        for system in args.systems.split(","):
            busy = wait_for_quiet(args.max_wait)
            out = subprocess.run([sys.executable, __file__, "--worker", system, str(n), str(args.max_tokens),
                                  str(args.threads)], capture_output=True, text=True,
                                 env={**os.environ, "OMP_NUM_THREADS": str(args.threads)})
            if out.returncode != 0:
                raise SystemExit(f"{system} x{n} failed:\n{out.stderr[-4000:]}")
            result = json.loads(out.stdout.strip().splitlines()[-1])
            rows.append({"system": system, "concurrency": n, "busy_at_start": round(busy, 2), **result})
            print(f"{system:>12} x{n:<3} {result}", file=sys.stderr)
    _report(rows, args.max_tokens, args.threads)


def _report(rows: list[dict[str, Any]], max_tokens: int, threads: int) -> None:
    by = {(r["system"], r["concurrency"]): r for r in rows}
    summary = []
    for n in sorted({r["concurrency"] for r in rows}):
        ours, theirs = by.get(("vidloom", n)), by.get(("transformers", n))
        entry: dict[str, Any] = {"concurrency": n}
        if ours and theirs:
            entry["tokens_per_s_vidloom_over_transformers"] = round(ours["tokens_per_s"] / theirs["tokens_per_s"], 2)
            entry["ttft_vidloom_over_transformers"] = round(ours["ttft_s"] / theirs["ttft_s"], 2)
            entry["rss_vidloom_over_transformers"] = round(ours["peak_rss_mib"] / theirs["peak_rss_mib"], 2)
        summary.append(entry)
    table = [[r["system"], r["concurrency"], r["tokens"], f"{r['wall_s']:.2f}", f"{r['tokens_per_s']:.1f}",
              f"{1000 * r['ttft_s']:.1f}", f"{r['peak_rss_mib']:.0f}"] for r in rows]
    print_table(["system", "concurrent", "tokens", "wall s", "tokens/s", "TTFT ms", "peak RSS MiB"], table)
    print(json.dumps(summary, indent=1))
    write_json("chat_decode.json", {
        "size": {"architecture": MID.transformer, "max_tokens": max_tokens, "greedy": True, "threads": threads},
        "environment": environment(), "runs": rows, "summary": summary,
    })


if __name__ == "__main__":
    main()
