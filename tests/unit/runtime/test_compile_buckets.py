"""Compiled shape buckets: declared shapes (x batch variants) run compiled, others eagerly and counted."""

from __future__ import annotations

import logging

from vidloom.core.request import GenerationRequest

from vidloom.media.request_inputs import resolve_request
from vidloom.families.wan.demo import demo_card
from vidloom.runtime.compile_buckets import LAZY_SHAPES, CompileBuckets, shape_key


def _req(height: int, width: int, frames: int, guidance: float = 5.0) -> GenerationRequest:
    return resolve_request(GenerationRequest("p", height=height, width=width, num_frames=frames,
                                             guidance_scale=guidance, seed=0), demo_card())


def test_declared_buckets_admit_only_their_shapes_and_count_misses(caplog):
    buckets = CompileBuckets(((32, 48, 5),), cfg_batched=False)
    assert buckets.admit(_req(32, 48, 5)) and buckets.admit(_req(32, 48, 5, guidance=1.0))
    with caplog.at_level(logging.WARNING, logger="vidloom.runtime.compile_buckets"):
        assert not buckets.admit(_req(48, 48, 5))
        assert not buckets.admit(_req(48, 48, 5))
    assert buckets.misses == 2 and buckets.capacity == 1
    assert "outside the compiled shape buckets" in caplog.text and "48x48x5" in caplog.text


def test_batched_cfg_doubles_the_batch_only_with_guidance():
    assert shape_key(_req(32, 48, 5), cfg_batched=True).batch == 2
    assert shape_key(_req(32, 48, 5, guidance=1.0), cfg_batched=True).batch == 1
    assert shape_key(_req(32, 48, 5), cfg_batched=False).batch == 1
    buckets = CompileBuckets(((32, 48, 5),), cfg_batched=True)
    assert buckets.capacity == 2  # both batch variants are warmed at load
    assert buckets.admit(_req(32, 48, 5)) and buckets.admit(_req(32, 48, 5, guidance=1.0))


def test_without_declared_shapes_the_first_few_compile_then_the_rest_run_eagerly():
    buckets = CompileBuckets((), cfg_batched=False)
    sizes = [(16 * (i + 1), 48, 5) for i in range(LAZY_SHAPES + 2)]
    admitted = [buckets.admit(_req(*size)) for size in sizes]
    assert admitted == [True] * LAZY_SHAPES + [False, False]
    assert buckets.admit(_req(*sizes[0]))  # an already compiled shape stays compiled
    assert buckets.misses == 2
