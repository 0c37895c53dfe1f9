"""Chat decode throughput (tokens/s) with 1, 4 and 16 concurrent requests through AsyncEngine.chat (continuous
batching on the paged KV pool) vs transformers' `generate` on the same random Cosmos3 weights (batch 1 and a
left-padded batch of the same size), time to first token, and peak RSS; one run, ratios in the table.

    OMP_NUM_THREADS=1 python bench/chat_decode.py [--size tiny|mid] [--tokens 48] [--device cpu]

Greedy decoding everywhere. Random weights may emit EOS early, so throughput counts the tokens each side
actually produced (transformers' padded batch keeps computing finished rows: those are not counted).
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from checkpoints import cached  # noqa: E402
from report import environment, print_table, write_json  # noqa: E402
from tests.helpers.cosmos3_checkpoints import COSMOS3_A, TinyCosmos3, build_reasoner, write_tiny_cosmos3  # noqa: E402

SIZES = {
    "tiny": COSMOS3_A,
    # A mid-size text backbone: 512 wide, 6 layers, GQA 8/2, head_dim 64 (~25M parameters with the padded vocab).
    "mid": TinyCosmos3(name="cosmos3-mid", transformer=dict(
        hidden_size=512, head_dim=64, num_attention_heads=8, num_key_value_heads=2, intermediate_size=1536,
        num_hidden_layers=6, rope_theta=5000000.0, rope_axes_dim=(12, 10, 10), latent_channel=4,
        patch_latent_dim=16, rms_norm_eps=1e-6)),
}
CONCURRENCY = (1, 4, 16)
PROMPTS = ["hello world", "tell me a story about robots", "what is in this picture?", "the quick brown fox",
           "cosmos predicts the future of the physical world", "1 2 3 4 5 6 7 8 9 0"]


def _checkpoint(size: str) -> Path:
    spec = SIZES[size]
    return cached(spec.name, lambda folder: write_tiny_cosmos3(folder, spec))


def _messages(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}]


def _vidloom(folder: Path, device: str, tokens: int) -> dict[int, dict[str, float]]:
    from vidloom.core.chat import build_chat_request
    from vidloom.generator import VideoGenerator
    from vidloom.runtime.async_engine import AsyncEngine

    engine = AsyncEngine(VideoGenerator.from_pretrained(folder, device=device).engine)

    async def one(i: int):
        request = build_chat_request(_messages(i), max_tokens=tokens, temperature=0)
        return [item async for item in engine.chat(request)][-1]

    async def many(n: int):
        return await asyncio.gather(*(one(i) for i in range(n)))

    out = {}
    try:
        asyncio.run(many(2))  # warm-up
        for n in CONCURRENCY:
            started = time.perf_counter()
            results = asyncio.run(many(n))
            wall = time.perf_counter() - started
            produced = sum(r.completion_tokens for r in results)
            out[n] = {"tokens": produced, "wall_s": wall, "tokens_per_s": produced / wall,
                      "ttft_mean_s": statistics.mean(r.time_to_first_token_s for r in results)}
    finally:
        engine.close()
    return out


@torch.inference_mode()
def _transformers(folder: Path, device: str, tokens: int) -> dict[int, dict[str, float]]:
    from diffusers import Cosmos3OmniTransformer
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder / "text_tokenizer")
    tokenizer.padding_side = "left"
    model = build_reasoner(Cosmos3OmniTransformer.from_pretrained(folder / "transformer"), tokenizer).to(device)
    eos = tokenizer.eos_token_id
    out = {}

    def run(n: int) -> tuple[int, float]:
        batch = tokenizer.apply_chat_template([_messages(i) for i in range(n)], add_generation_prompt=True,
                                              return_dict=True, return_tensors="pt", padding=True).to(device)
        started = time.perf_counter()
        ids = model.generate(**batch, max_new_tokens=tokens, do_sample=False)[:, batch["input_ids"].shape[1]:]
        wall = time.perf_counter() - started
        produced = 0
        for row in ids.tolist():
            produced += row.index(eos) + 1 if eos in row else len(row)
        return produced, wall

    run(2)  # warm-up
    for n in CONCURRENCY:
        produced, wall = run(n)
        out[n] = {"tokens": produced, "wall_s": wall, "tokens_per_s": produced / wall}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="mid", choices=sorted(SIZES))
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    folder = _checkpoint(args.size)
    ours = _vidloom(folder, args.device, args.tokens)
    theirs = _transformers(folder, args.device, args.tokens)
    rows = [[str(n), f"{ours[n]['tokens_per_s']:.1f}", f"{theirs[n]['tokens_per_s']:.1f}",
             f"{ours[n]['tokens_per_s'] / theirs[n]['tokens_per_s']:.2f}", f"{ours[n]['ttft_mean_s'] * 1000:.1f}"]
            for n in CONCURRENCY]
    print_table(["concurrent", "vidloom tok/s", "transformers tok/s", "ratio", "vidloom TTFT ms"], rows)
    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS {peak_rss_mb:.0f} MiB")
    write_json(args.out or f"chat_decode-{args.size}-{args.device.split(':')[0]}.json", {
        "environment": environment(), "size": args.size, "max_tokens": args.tokens, "vidloom": ours,
        "transformers_generate": theirs, "peak_rss_mb": peak_rss_mb,
    })


if __name__ == "__main__":
    main()
