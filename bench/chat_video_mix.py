"""Chat time-to-first-token and video throughput when both run at once on one AsyncEngine (one Cosmos3 model that
chats and generates), against each alone; one run, ratios in the table.

    OMP_NUM_THREADS=1 python bench/chat_video_mix.py [--size 64] [--steps 80] [--repeats 3] [--tokens 16]

`--repeats` videos of `--steps` denoise steps render one after another while chats arrive one after another (each
starts when the previous one ends, so every TTFT is measured with a video mid-render); then the same videos alone
and `--chats` chats alone. Medians (the machine's noise is large at these millisecond scales). Run it with
PYTHONPATH pointing at another checkout to measure that code (the "before" of a change): only AsyncEngine.submit
and AsyncEngine.chat are used. The scheduler's policy is in vidloom/runtime/scheduler.py.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))  # after PYTHONPATH: another checkout's vidloom wins when given

from checkpoints import cached  # noqa: E402
from report import environment, print_table, write_json  # noqa: E402
from tests.helpers.cosmos3_checkpoints import COSMOS3_A, write_tiny_cosmos3  # noqa: E402

PROMPTS = ["hello world", "tell me a story about robots", "what is in this picture?", "the quick brown fox"]


def _checkpoint() -> Path:
    return cached(COSMOS3_A.name, lambda folder: write_tiny_cosmos3(folder, COSMOS3_A))


async def _chats(engine, count: int | None, tokens: int, until=None) -> list[float]:
    """TTFT of chats run one after another: `count` of them, or as many as fit before `until` (a task) is done."""
    from vidloom.core.chat import build_chat_request

    ttfts: list[float] = []
    while (count is None or len(ttfts) < count) and not (until is not None and until.done()):
        text = PROMPTS[len(ttfts) % len(PROMPTS)]
        request = build_chat_request([{"role": "user", "content": text}], max_tokens=tokens, temperature=0)
        started = time.perf_counter()
        first = None
        async for _ in engine.chat(request):
            first = first or time.perf_counter() - started
        ttfts.append(first)
    return ttfts


async def _videos(engine, request, repeats: int) -> list[float]:
    """Wall time of `repeats` videos rendered one after another."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        await engine.submit(request).result()
        times.append(time.perf_counter() - started)
    return times


def measure(size: int, steps: int, repeats: int, chats: int, tokens: int) -> dict[str, float]:
    from vidloom.core.deploy import DeployConfig
    from vidloom.core.request import GenerationRequest
    from vidloom.generator import VideoGenerator
    from vidloom.runtime.async_engine import AsyncEngine

    generator = VideoGenerator.from_pretrained(_checkpoint(), device="cpu", deploy=DeployConfig(kv_pool_tokens=4096))
    engine = AsyncEngine(generator.engine)
    request = GenerationRequest(prompt="a fox in the snow", num_frames=5, height=size, width=size,
                                num_inference_steps=steps, guidance_scale=3.0, fps=24, seed=0)

    async def mixed() -> tuple[list[float], list[float]]:
        videos = asyncio.ensure_future(_videos(engine, request, repeats))
        await asyncio.sleep(0.02)  # the first video is denoising
        ttfts = await _chats(engine, None, tokens, videos)
        return await videos, ttfts

    try:
        asyncio.run(_videos(engine, request, 1))  # warm-up
        asyncio.run(_chats(engine, 2, tokens))
        video_alone = asyncio.run(_videos(engine, request, repeats))
        chats_alone = asyncio.run(_chats(engine, chats, tokens))
        video_mixed, chats_mixed = asyncio.run(mixed())
    finally:
        engine.close()
    median = statistics.median
    return {"video_alone_s": median(video_alone), "video_mixed_s": median(video_mixed),
            "step_ms": 1000 * median(video_alone) / steps, "step_mixed_ms": 1000 * median(video_mixed) / steps,
            "ttft_alone_ms": 1000 * median(chats_alone), "ttft_alone_p95_ms": 1000 * _quantile(chats_alone, 0.95),
            "ttft_mixed_ms": 1000 * median(chats_mixed), "ttft_mixed_p90_ms": 1000 * _quantile(chats_mixed, 0.9),
            "ttft_mixed_p95_ms": 1000 * _quantile(chats_mixed, 0.95), "chats_during_videos": len(chats_mixed),
            "loadavg_1m_after": os.getloadavg()[0]}


def _quantile(values: list[float], q: float) -> float:
    """The nearest-rank quantile (no interpolation: with a dozen samples it is one of them)."""
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=64, help="video height and width")
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--repeats", type=int, default=3, help="videos per phase")
    parser.add_argument("--chats", type=int, default=12, help="chats in the chat-alone phase")
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--runs", type=int, default=1, help="whole measurements; the table shows their medians")
    parser.add_argument("--label", default="this checkout")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    runs = []
    for _ in range(args.runs):
        runs.append(measure(args.size, args.steps, args.repeats, args.chats, args.tokens))
    r = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
    print(f"{args.label}: {r['step_ms']:.1f} ms per video step (whole video / steps); "
          f"{r['chats_during_videos']} chats during {args.repeats} videos; median of {args.runs} runs")
    print_table(["median", "alone", "with the other", "ratio"], [
        ["video s", f"{r['video_alone_s']:.3f}", f"{r['video_mixed_s']:.3f}",
         f"{r['video_mixed_s'] / r['video_alone_s']:.2f}"],
        ["video ms / step", f"{r['step_ms']:.1f}", f"{r['step_mixed_ms']:.1f}",
         f"{r['step_mixed_ms'] / r['step_ms']:.2f}"],
        ["chat TTFT ms, p50", f"{r['ttft_alone_ms']:.1f}", f"{r['ttft_mixed_ms']:.1f}",
         f"{r['ttft_mixed_ms'] / r['ttft_alone_ms']:.2f}"],
        ["chat TTFT ms, p95", f"{r['ttft_alone_p95_ms']:.1f}", f"{r['ttft_mixed_p95_ms']:.1f}",
         f"{r['ttft_mixed_p95_ms'] / r['ttft_alone_p95_ms']:.2f}"],
    ])
    write_json(args.out or "chat_video_mix.json", {"environment": environment(), "label": args.label,
                                                   "args": vars(args), "median": r, "runs": runs})


if __name__ == "__main__":
    main()
