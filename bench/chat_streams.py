"""The side-by-side report's chat rows: 16 concurrent greedy streams through vidloom's AsyncEngine.chat
(continuous batching on the paged KV pool) vs transformers' `generate` on one left-padded batch of the same
16 prompts, on the same random weights and dtype (Cosmos3's reasoner; Qwen3-Omni's MoE thinker).

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
from typing import Any, Callable

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


def cosmos3_reference(folder: Path, dtype: str) -> Callable[[list[list[dict[str, str]]]], list[list[int]]]:
    """Cosmos3's reasoner (transformers) on the checkpoint: conversations -> greedy ids, one left-padded batch."""
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
    def run(conversations: list[list[dict[str, str]]]) -> list[list[int]]:
        batch = tokenizer.apply_chat_template(conversations, add_generation_prompt=True, return_dict=True,
                                              return_tensors="pt", padding=True)
        ids = model.generate(**batch, max_new_tokens=CHAT_TOKENS, do_sample=False)[:, batch["input_ids"].shape[1]:]
        return [row[: row.index(eos) + 1] if eos in row else row for row in ids.tolist()]

    return run


def qwen3_omni_reference(folder: Path, dtype: str) -> Callable[[list[list[dict[str, str]]]], list[list[int]]]:
    """Qwen3-Omni's `generate(return_audio=False)` (transformers: the MoE thinker) on one left-padded batch."""
    import torch
    from transformers import AutoTokenizer, Qwen3OmniMoeForConditionalGeneration

    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.padding_side = "left"
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(folder, dtype=getattr(torch, dtype)).eval()
    stops = [tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]

    @torch.inference_mode()
    def run(conversations: list[list[dict[str, str]]]) -> list[list[int]]:
        batch = tokenizer.apply_chat_template(conversations, add_generation_prompt=True, return_dict=True,
                                              return_tensors="pt", padding=True)
        out = model.generate(batch["input_ids"], attention_mask=batch["attention_mask"], return_audio=False,
                             thinker_max_new_tokens=CHAT_TOKENS, thinker_do_sample=False, thinker_eos_token_id=stops)
        rows = out[:, batch["input_ids"].shape[1]:].tolist()
        return [row[: min(row.index(s) for s in stops if s in row) + 1] if any(s in row for s in stops) else row
                for row in rows]

    return run


def _transformers(folder: Path, dtype: str, reference: Callable[[Path, str], Any]
                  ) -> tuple[list[list[int]], float, float, str]:
    run = reference(folder, dtype)
    run([_messages(i) for i in range(2)])  # warm-up
    wall0, cpu0 = time.perf_counter(), _cpu_s()
    tokens = run([_messages(i) for i in range(CHAT_STREAMS)])
    return tokens, time.perf_counter() - wall0, _cpu_s() - cpu0, dtype


def chat_worker(folder: Path, setting: str, ids_path: Path, reference: Callable[[Path, str], Any]) -> dict[str, Any]:
    """One chat setting in this process (`reference`: the family's transformers side, cosmos3_reference or
    qwen3_omni_reference); saves the token ids (-1 padded) to `ids_path`."""
    if setting.startswith("vidloom"):
        tokens, wall, cpu, used = _vidloom(folder, None if setting == "vidloom default" else "float32")
    else:
        dtype = "bfloat16" if setting.endswith("bfloat16") else "float32"
        tokens, wall, cpu, used = _transformers(folder, dtype, reference)
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
