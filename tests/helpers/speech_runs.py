"""Speech requests run together on one AsyncEngine, counting the sequences of each talker forward."""

from __future__ import annotations

import asyncio
from typing import Any, Sequence

import torch

from vidloom.core.speech import SpeechRequest
from vidloom.generator import VideoGenerator
from vidloom.runtime.async_engine import AsyncEngine


def speak_together(gen: VideoGenerator, requests: Sequence[SpeechRequest], policy: str,
                   talker: Any = None) -> tuple[list[dict[str, Any]], list[int]]:
    """Submit every request at once (3 slots, `policy`); return their outputs in order and, per talker
    forward (`talker`: the paged network; None: the instance's "talker"), how many sequences it ran."""
    talker = talker if talker is not None else gen.engine.instance["talker"]
    batches: list[int] = []
    hook = talker.register_forward_pre_hook(
        lambda module, args, kwargs: batches.append(int(kwargs["kv"].key_slots.shape[0])), with_kwargs=True)
    engine = AsyncEngine(gen.engine, slots=3, policy=policy)
    try:
        async def together() -> list[dict[str, Any]]:
            handles = [engine.submit(r, result=lambda out: out) for r in requests]
            return [await handle.result() for handle in handles]

        return asyncio.run(together()), batches
    finally:
        hook.remove()
        engine.close()


def speak_whole_budget(talker_loop: Any) -> None:
    """Make a talker loop speak every frame of its budget (a random talker stops anywhere): Qwen2.5-Omni's stops on
    its end_ids, Qwen3-Omni's on the codec's end id, masked here (for the rest of the process)."""
    if hasattr(talker_loop, "end_ids"):
        talker_loop.end_ids = frozenset()
        return
    from vidloom.families.qwen3_omni import speech_loops

    shape, end = speech_loops.shape_logits, torch.tensor([talker_loop.talker.speech.codec_eos])
    speech_loops.shape_logits = lambda *args: shape(*args).index_fill(0, end, float("-inf"))
