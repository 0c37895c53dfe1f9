"""Requests' steps under the batch policy: the first planned steps of several runs, one batched step checked against
the single ones, and requests served together by an AsyncEngine (policy "batch")."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import numpy as np
import torch

from vidloom.runtime.async_engine import AsyncEngine
from vidloom.runtime.batching import run_batched
from vidloom.runtime.results import video_output


@contextlib.contextmanager
def first_plans(engine: Any, requests: list[Any]) -> Iterator[list[Any]]:
    """Each request's first planned loop step (nothing executed yet); the runs close on exit."""
    runs = [engine.submit(r) for r in requests]
    try:
        for run in runs:
            while not run.prepare():
                pass
        yield [run.pending_plan for run in runs]
    finally:
        for run in runs:
            run.close()


def assert_batched_equals_single(plans: list[Any], rtol: float) -> None:
    """`plans` run as one forward give each plan's own output within `rtol` of its magnitude."""
    with torch.inference_mode():
        for plan, result in zip(plans, run_batched(plans)):
            alone = plan.call(**plan.inputs)
            assert result.shape == alone.shape
            assert (result - alone).abs().max() <= rtol * alone.abs().max()


def serve_batched(engine: Any, requests: list[Any], timeout_s: float = 300,
                  batch_wait_s: float = 0.0) -> tuple[list[Any], dict[str, float]]:
    """`requests` submitted together to an AsyncEngine with policy "batch" over `engine`: their results (in order)
    and the policy's batch stats. `batch_wait_s`: a step with room in its batch waits once for the others (a loop whose
    first steps differ in key, as Cosmos3's prompt prefills per CFG branch, may otherwise never catch up when the
    second request is admitted a few steps late on a loaded machine)."""
    async_engine = AsyncEngine(engine, policy="batch", slots=len(requests), queue_size=max(4, len(requests)),
                               batch_wait_s=batch_wait_s)
    try:
        handles = [async_engine.submit(r) for r in requests]
        return [h.wait(timeout_s) for h in handles], async_engine.batch_stats
    finally:
        async_engine.close()


def assert_served_like_alone(engine: Any, requests: list[Any], uint8_tolerance: int) -> None:
    """`requests` served together shared their steps, none ran alone, and each result's frames equal its run alone
    within `uint8_tolerance` levels."""
    expected = [video_output(engine.instance.card, engine.run(r)).frames for r in requests]
    got, stats = serve_batched(engine, requests)
    assert stats["largest_batch"] == len(requests), stats
    for out, alone in zip(got, expected):
        assert np.abs(out.frames.astype(int) - alone.astype(int)).max() <= uint8_tolerance
        assert "disabled" not in out.metadata
