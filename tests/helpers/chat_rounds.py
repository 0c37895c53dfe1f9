"""Chats stepped together in rounds, one paged decode forward per round over every running sequence, as the
AsyncEngine's worker steps them (runtime.worker_rounds._decode_round), but deterministic: every chat joins in the
first round and leaves when its budget or end token says."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from vidloom.core.chat import build_chat_request
from vidloom.core.loop import is_decode_step


def greedy_rounds(engine: Any, prompts: Sequence[str],
                  budgets: Sequence[int]) -> tuple[list[tuple[int, ...]], list[torch.Tensor]]:
    """Greedy chats of `prompts` (user turns) with `budgets` max_tokens: each chat's tokens, and every round's logits
    rows [live sequences, vocab] in the chats' order (the first round prefills every prompt)."""
    runs = [engine.submit(build_chat_request([{"role": "user", "content": p}], max_tokens=n, temperature=0))
            for p, n in zip(prompts, budgets)]
    rounds = []
    try:
        while not all(run.done for run in runs):
            live = [run for run in runs if not run.done and run.prepare() and is_decode_step(run.pending_plan)]
            rows = engine.decoder.run([run.pending_plan for run in live])
            rounds.append(torch.stack(rows))
            for run, row in zip(live, rows):
                run.complete(row)
                run.prepare()
        return [run.outputs()["completion"].token_ids for run in runs], rounds
    finally:
        for run in runs:
            run.close()
