"""Chat time-to-first-token and video throughput when both run at once on one AsyncEngine (one Cosmos3 model that
chats and generates), against each alone; one run, ratios in the table.

    OMP_NUM_THREADS=1 python bench/chat_video_mix.py [--size 64] [--steps 12] [--chats 8] [--tokens 24]

A video of `--steps` denoise steps renders while `--chats` chats arrive one after another (each starts when the
previous one ends, so every TTFT is measured with the video mid-render); then the same video alone and the same
chats alone. Run it with PYTHONPATH pointing at another checkout to measure that code (the "before" of a change):
only AsyncEngine.submit and AsyncEngine.chat are used. The scheduler's policy is in vidloom/runtime/scheduler.py.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))  # after PYTHONPATH: another checkout's vidloom wins when given

from report import environment, print_table, write_json  # noqa: E402
from tests.helpers.cosmos3_checkpoints import COSMOS3_A, write_tiny_cosmos3  # noqa: E402

CACHE = ROOT / "bench" / ".cache"
PROMPTS = ["hello world", "tell me a story about robots", "what is in this picture?", "the quick brown fox"]


def _checkpoint() -> Path:
    folder = CACHE / COSMOS3_A.name
    if not (folder / "model_index.json").exists():
        write_tiny_cosmos3(folder, COSMOS3_A)
    return folder


async def _chats(engine, count: int, tokens: int, video=None) -> list[float]:
    """TTFT of `count` chats run one after another (while `video` renders, if given: stops when it ends)."""
    from vidloom.core.chat import build_chat_request

    ttfts = []
    for i in range(count):
        if video is not None and video.done():
            break
        request = build_chat_request([{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}], max_tokens=tokens,
                                     temperature=0)
        started = time.perf_counter()
        first = None
        async for _ in engine.chat(request):
            first = first or time.perf_counter() - started
        ttfts.append(first)
    return ttfts


async def _video(engine, request) -> float:
    started = time.perf_counter()
    await engine.submit(request).result()
    return time.perf_counter() - started


def measure(size: int, steps: int, chats: int, tokens: int) -> dict[str, float]:
    from vidloom.core.deploy import DeployConfig
    from vidloom.core.request import GenerationRequest
    from vidloom.generator import VideoGenerator
    from vidloom.runtime.async_engine import AsyncEngine

    generator = VideoGenerator.from_pretrained(_checkpoint(), device="cpu", deploy=DeployConfig(kv_pool_tokens=4096))
    engine = AsyncEngine(generator.engine)
    request = GenerationRequest(prompt="a fox in the snow", num_frames=5, height=size, width=size,
                                num_inference_steps=steps, guidance_scale=3.0, fps=24, seed=0)

    async def mixed() -> tuple[float, list[float]]:
        video = asyncio.ensure_future(_video(engine, request))
        await asyncio.sleep(0.05)  # the video is denoising
        ttfts = await _chats(engine, chats, tokens, video)
        return await video, ttfts

    try:
        asyncio.run(_video(engine, request))  # warm-up
        asyncio.run(_chats(engine, 2, tokens))
        video_alone = asyncio.run(_video(engine, request))
        chats_alone = asyncio.run(_chats(engine, chats, tokens))
        video_mixed, chats_mixed = asyncio.run(mixed())
    finally:
        engine.close()
    return {"video_alone_s": video_alone, "video_mixed_s": video_mixed, "step_s": video_alone / steps,
            "ttft_alone_ms": 1000 * statistics.mean(chats_alone), "ttft_mixed_ms": 1000 * statistics.mean(chats_mixed),
            "ttft_mixed_max_ms": 1000 * max(chats_mixed), "chats_during_video": len(chats_mixed)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=64, help="video height and width")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--chats", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--label", default="this checkout")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    r = measure(args.size, args.steps, args.chats, args.tokens)
    print(f"{args.label}: one denoise step {r['step_s'] * 1000:.1f} ms; {r['chats_during_video']} chats during the video")
    print_table(["", "alone", "with the other", "ratio"], [
        ["video s", f"{r['video_alone_s']:.2f}", f"{r['video_mixed_s']:.2f}",
         f"{r['video_mixed_s'] / r['video_alone_s']:.2f}"],
        ["chat TTFT ms (mean)", f"{r['ttft_alone_ms']:.1f}", f"{r['ttft_mixed_ms']:.1f}",
         f"{r['ttft_mixed_ms'] / r['ttft_alone_ms']:.2f}"],
        ["chat TTFT ms (max, mixed)", "", f"{r['ttft_mixed_max_ms']:.1f}", ""],
    ])
    write_json(args.out or "chat_video_mix.json", {"environment": environment(), "label": args.label,
                                                   "args": vars(args), **r})


if __name__ == "__main__":
    main()
