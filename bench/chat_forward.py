"""One chat decode step at 16 sequences, forward alone: vidloom's paged-KV forward vs transformers' forward with
its KV cache, on the same random Cosmos3 weights (bench/family_bench.py's cosmos3-mid) in bfloat16, one thread.

vidloom's inputs are captured from a real 16-stream AsyncEngine.chat run (its packed tokens, positions and the
paged KV view of a decode step); transformers' are 16 sequences of 30 cached tokens plus one new token each.
Rounds alternate (ours, theirs, theirs, ours, ...); each times 10 forwards by this thread's CPU time.

    python bench/chat_forward.py [--rounds 5]
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
for _path in (str(ROOT), str(ROOT / "bench")):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import torch  # noqa: E402

from family_bench import CHAT_PROMPTS, CHAT_STREAMS, FAMILIES  # noqa: E402
from report import environment, write_json  # noqa: E402


def _captured_decode_step(folder: Path) -> tuple[torch.nn.Module, tuple, dict]:
    """vidloom's network and the arguments of one of its 16-sequence decode forwards."""
    from vidloom.core.chat import build_chat_request
    from vidloom.generator import VideoGenerator
    from vidloom.runtime.async_engine import AsyncEngine

    generator = VideoGenerator.from_pretrained(folder, device="cpu", dtype="bfloat16")
    network = generator.engine.decoder.loop.network
    captured: list[tuple[tuple, dict]] = []
    forward = type(network).forward

    def capture(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        if args[0].shape[0] == CHAT_STREAMS and not captured:
            captured.append((args, kwargs))
        return forward(self, *args, **kwargs)

    engine = AsyncEngine(generator.engine)

    async def many() -> None:
        async def one(i: int) -> None:
            request = build_chat_request([{"role": "user", "content": CHAT_PROMPTS[i % len(CHAT_PROMPTS)]}],
                                         max_tokens=8, temperature=0)
            async for _ in engine.chat(request):
                pass
        await asyncio.gather(*(one(i) for i in range(CHAT_STREAMS)))

    type(network).forward = capture
    try:
        asyncio.run(many())
    finally:
        type(network).forward = forward
        engine.close()
    args, kwargs = captured[0]
    return network, args, kwargs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    from diffusers import Cosmos3OmniTransformer
    from transformers import AutoTokenizer

    from tests.helpers.cosmos3_checkpoints import build_reasoner

    folder = FAMILIES["cosmos3-chat-mid"].checkpoint()
    network, net_args, net_kwargs = _captured_decode_step(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder / "text_tokenizer")
    reference = build_reasoner(Cosmos3OmniTransformer.from_pretrained(folder / "transformer"), tokenizer)
    reference = reference.to(torch.bfloat16).eval()
    with torch.inference_mode():
        cache = reference(input_ids=torch.randint(0, 300, (CHAT_STREAMS, 30)), use_cache=True).past_key_values
        new = torch.randint(0, 300, (CHAT_STREAMS, 1))

        def theirs() -> None:
            reference(input_ids=new, past_key_values=cache, use_cache=True)
            cache.crop(-1)  # back to the 30 cached tokens

        def ours() -> None:
            network(*net_args, **net_kwargs)

        sides = {"vidloom": ours, "transformers": theirs}
        for fn in sides.values():
            for _ in range(3):
                fn()
        ms: dict[str, list[float]] = {name: [] for name in sides}
        loads = []
        for r in range(args.rounds):
            for name, fn in (sides.items() if r % 2 == 0 else list(sides.items())[::-1]):
                loads.append(round(os.getloadavg()[0], 2))
                started = time.thread_time()
                for _ in range(10):
                    fn()
                ms[name].append(round((time.thread_time() - started) / 10 * 1e3, 2))
    medians = {name: statistics.median(v) for name, v in ms.items()}
    print(f"decode forward, {CHAT_STREAMS} sequences, bf16, thread CPU ms (median of {args.rounds}): {medians}")
    write_json("chat_forward-mid-cpu.json", {
        "environment": environment(), "what": __doc__.splitlines()[0], "rounds": args.rounds,
        "thread_cpu_ms_per_forward": ms, "median_ms": medians, "loadavg_1m_at_each_round": loads,
        "ratio_transformers_over_vidloom": round(medians["transformers"] / medians["vidloom"], 3)})


if __name__ == "__main__":
    main()
