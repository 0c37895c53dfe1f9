"""The side-by-side report's chat row: 16 concurrent greedy streams through vidloom's AsyncEngine.chat
(continuous batching on the paged KV pool) vs transformers' `generate` on one left-padded batch of the same
16 prompts, on the same random Cosmos3 weights and dtype.

Run inside a side-by-side worker process (bench/side_by_side.py): load, warm up on 2 streams, then time
CHAT_STREAMS streams once. Throughput counts the tokens each side produced (random weights may emit EOS
early; transformers' padded batch keeps computing finished rows, which are not counted). The token ids are
saved so the report can compare them with vidloom float32's (greedy: the same ids, up to rounding ties).
"""

from __future__ import annotations

import asyncio
import resource
import time
from pathlib import Path
from typing import Any

import numpy as np

from family_bench import CHAT_PROMPTS, CHAT_STREAMS, CHAT_TOKENS
from side_by_side import peak_rss_mib


def _messages(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": CHAT_PROMPTS[i % len(CHAT_PROMPTS)]}]


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _vidloom(folder: Path, dtype: str | None) -> tuple[list[list[int]], float, float, str]:
    from vidloom.core.chat import build_chat_request
    from vidloom.generator import VideoGenerator
    from vidloom.runtime.async_engine import AsyncEngine

    generator = VideoGenerator.from_pretrained(folder, device="cpu", dtype=dtype)
    used = str(generator.engine.instance.dtype).removeprefix("torch.")
    engine = AsyncEngine(generator.engine)

    async def one(i: int) -> Any:
        request = build_chat_request(_messages(i), max_tokens=CHAT_TOKENS, temperature=0)
        return [item async for item in engine.chat(request)][-1]

    async def many(n: int) -> list[Any]:
        return await asyncio.gather(*(one(i) for i in range(n)))

    try:
        asyncio.run(many(2))  # warm-up
        wall0, cpu0 = time.perf_counter(), _cpu_s()
        results = asyncio.run(many(CHAT_STREAMS))
        wall, cpu = time.perf_counter() - wall0, _cpu_s() - cpu0
    finally:
        engine.close()
    return [list(r.token_ids) for r in results], wall, cpu, used


def _transformers(folder: Path, dtype: str) -> tuple[list[list[int]], float, float, str]:
    import torch
    from diffusers import Cosmos3OmniTransformer
    from transformers import AutoTokenizer

    from tests.helpers.cosmos3_checkpoints import build_reasoner

    tokenizer = AutoTokenizer.from_pretrained(folder / "text_tokenizer")
    tokenizer.padding_side = "left"
    model = build_reasoner(Cosmos3OmniTransformer.from_pretrained(folder / "transformer"), tokenizer)
    model = model.to(getattr(torch, dtype)).eval()
    eos = tokenizer.eos_token_id

    @torch.inference_mode()
    def run(n: int) -> list[list[int]]:
        batch = tokenizer.apply_chat_template([_messages(i) for i in range(n)], add_generation_prompt=True,
                                              return_dict=True, return_tensors="pt", padding=True)
        ids = model.generate(**batch, max_new_tokens=CHAT_TOKENS, do_sample=False)[:, batch["input_ids"].shape[1]:]
        return [row[: row.index(eos) + 1] if eos in row else row for row in ids.tolist()]

    run(2)  # warm-up
    wall0, cpu0 = time.perf_counter(), _cpu_s()
    tokens = run(CHAT_STREAMS)
    return tokens, time.perf_counter() - wall0, _cpu_s() - cpu0, dtype


def chat_worker(folder: Path, setting: str, ids_path: Path) -> dict[str, Any]:
    """One chat setting in this process; saves the token ids (-1 padded) to `ids_path`."""
    if setting.startswith("vidloom"):
        tokens, wall, cpu, used = _vidloom(folder, None if setting == "vidloom default" else "float32")
    else:
        tokens, wall, cpu, used = _transformers(folder, "bfloat16" if setting.endswith("bfloat16") else "float32")
    padded = np.full((len(tokens), CHAT_TOKENS), -1, dtype=np.int64)
    for i, row in enumerate(tokens):
        padded[i, : len(row)] = row[:CHAT_TOKENS]
    np.save(ids_path, padded)
    produced = sum(len(row) for row in tokens)
    return {"dtype": used, "wall_s": round(wall, 3), "cpu_s": round(cpu, 3), "tokens": produced,
            "tokens_per_s": round(produced / wall, 1), "streams": CHAT_STREAMS,
            "peak_rss_mib": peak_rss_mib()}


def token_match(ids: np.ndarray, reference: np.ndarray) -> float:
    """Mean, over streams, of the fraction of the reference's tokens reproduced before the first difference."""
    fractions = []
    for ours, theirs in zip(ids, reference):
        length = int((theirs >= 0).sum())
        same = ours[:length] == theirs[:length]
        prefix = length if same.all() else int(np.argmin(same))
        fractions.append(prefix / max(1, length))
    return round(float(np.mean(fractions)), 3)
