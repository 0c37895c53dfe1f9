"""Chat through the server: tokens/s at 1, 4 and 16 concurrent streaming clients, against the engine alone and
transformers' `generate`; time to first token as a client sees it; peak RSS per configuration.

bench/chat_decode.py measures the engine (AsyncEngine.chat) against transformers in one process. This
benchmark adds what the HTTP layer costs: the same N greedy requests sent by N concurrent clients to
`/v1/chat/completions` (real uvicorn on 127.0.0.1, `stream: true` with usage), next to the same requests
on AsyncEngine.chat directly and to transformers' Cosmos3OmniForConditionalGeneration.generate on the
same N prompts as one left-padded batch (what `generate` offers). Same checkpoint as chat_decode.py
(--size mid). Tokens/s counts the tokens each request really produced (vidloom stops a sequence at EOS;
transformers keeps computing padding for it, which is its cost). Time to first token: server, from
sending the request to the first SSE chunk (sent once the first token exists); engine, from submission
to the first item; transformers, a `generate(max_new_tokens=1)` of the batch. Each (system, concurrency)
runs in a fresh subprocess after a warm-up request, so peak RSS is that configuration's alone.

    python bench/chat_serve.py [--concurrency 1,4,16] [--max-tokens 48] [--systems server,engine,transformers]
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

from checkpoints import cached  # noqa: E402
from report import environment, print_table, wait_for_quiet, write_json  # noqa: E402
from chat_decode import SIZES  # noqa: E402  (the same checkpoint as the engine benchmark)
from tests.helpers.cosmos3_checkpoints import write_tiny_cosmos3  # noqa: E402

SIZE = "mid"
SYSTEMS = ("server", "engine", "transformers")
PROMPTS = (
    "tell me a story about robots",
    "what is in this picture? a red fox jumps over the lazy dog in the snow",
    "cosmos predicts the future of the physical world. the quick brown fox",
    "hello world! 1 2 3 4 5 6 7 8 9 0",
)


def _checkpoint() -> Path:
    return cached(SIZES[SIZE].name, lambda folder: write_tiny_cosmos3(folder, SIZES[SIZE]))


def _messages(i: int) -> list[dict[str, str]]:
    """Request i's conversation: prompts of different lengths, so the batch is ragged."""
    text = " ".join(PROMPTS[j % len(PROMPTS)] for j in range(i % 3 + 1))
    return [{"role": "system", "content": "you are a helpful assistant"}, {"role": "user", "content": f"{i}: {text}"}]


# -- workers: one system and concurrency per process ---------------------------------------------


def _run_engine(folder: Path, n: int, max_tokens: int) -> dict[str, float]:
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


def _run_server(folder: Path, n: int, max_tokens: int) -> dict[str, float]:
    import asyncio
    import tempfile

    import httpx

    from tests.helpers.servers import ThreadServer
    from vidloom.generator import VideoGenerator
    from vidloom.serving.config import ServeConfig

    engine = VideoGenerator.from_pretrained(folder, device="cpu").engine
    data_dir = Path(tempfile.mkdtemp(prefix="chat-serve-"))

    async def one(client: httpx.AsyncClient, i: int, tokens: int) -> tuple[float, int]:
        body = {"messages": _messages(i), "max_tokens": tokens, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}}
        start, first, usage = time.perf_counter(), None, None
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            response.raise_for_status()
            async for line in response.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                if first is None:
                    first = time.perf_counter() - start
                usage = json.loads(line[6:]).get("usage") or usage
        if first is None or usage is None:
            raise RuntimeError("the stream carried no chunk or no usage")
        return first, usage["completion_tokens"]

    async def run(url: str, tokens: int) -> tuple[float, list[tuple[float, int]]]:
        limits = httpx.Limits(max_connections=n + 1)
        async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
            start = time.perf_counter()
            results = await asyncio.gather(*(one(client, i, tokens) for i in range(n)))
            return time.perf_counter() - start, list(results)

    with ThreadServer(engine, ServeConfig(data_dir=data_dir, queue_size=max(16, n))) as server:
        asyncio.run(run(server.url, 4))  # warm-up
        wall, results = asyncio.run(run(server.url, max_tokens))
    tokens = sum(r[1] for r in results)
    return {"wall_s": wall, "tokens": tokens, "tokens_per_s": tokens / wall, "ttft_s": sum(r[0] for r in results) / n}


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
    run = {"server": _run_server, "engine": _run_engine, "transformers": _run_transformers}[system]
    result: dict[str, Any] = run(folder, n, max_tokens)
    result["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(result))


# -- driver ---------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", default="1,4,16")
    parser.add_argument("--max-tokens", type=int, default=48)
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
        entry: dict[str, Any] = {"concurrency": n}
        for ours, theirs in (("server", "engine"), ("server", "transformers"), ("engine", "transformers")):
            a, b = by.get((ours, n)), by.get((theirs, n))
            if a and b:
                entry[f"tokens_per_s_{ours}_over_{theirs}"] = round(a["tokens_per_s"] / b["tokens_per_s"], 2)
                entry[f"ttft_{ours}_over_{theirs}"] = round(a["ttft_s"] / b["ttft_s"], 2)
                entry[f"rss_{ours}_over_{theirs}"] = round(a["peak_rss_mib"] / b["peak_rss_mib"], 2)
        summary.append(entry)
    table = [[r["system"], r["concurrency"], r["tokens"], f"{r['wall_s']:.2f}", f"{r['tokens_per_s']:.1f}",
              f"{1000 * r['ttft_s']:.1f}", f"{r['peak_rss_mib']:.0f}"] for r in rows]
    print_table(["system", "concurrent", "tokens", "wall s", "tokens/s", "TTFT ms", "peak RSS MiB"], table)
    print(json.dumps(summary, indent=1))
    write_json("chat_serve.json", {
        "size": {"checkpoint": SIZE, "architecture": SIZES[SIZE].transformer, "max_tokens": max_tokens,
                 "greedy": True, "threads": threads},
        "environment": environment(), "runs": rows, "summary": summary,
    })


if __name__ == "__main__":
    main()
