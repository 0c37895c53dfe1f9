"""The checks every family's graphed paged decode passes (runtime.decode_graphs): chats stepped together in rounds
(tests/helpers/chat_rounds.py) over shrinking batch buckets with mixed lengths, through the CPU stand-in capturer
(tests/integration) or real CUDA graphs (tests/gpu), against the eager run of the same weights."""

from __future__ import annotations

from typing import Any

from tests.helpers.chat_rounds import greedy_rounds
from tests.helpers.graph_capturer import RecordingCapturer, graphed_generator

PROMPTS = ("what is a kite?", "tell me about the long history of paper kites in the windy coastal towns",
           "hi", "name three colours of the evening sky over the sea")
BUDGETS = (6, 4, 2)  # 3 sequences (bucket 4), then 2 (bucket 2), then 1 (bucket 1)


def worst_logit_gap(want_rounds: list, got_rounds: list) -> float:
    """The largest |graphed - eager| logit of any round, over that round's largest eager logit (shapes must match)."""
    worst = 0.0
    for want, got in zip(want_rounds, got_rounds):
        assert got.shape == want.shape
        worst = max(worst, ((got - want).abs().max() / want.abs().max()).item())
    return worst


def check_stand_in_graphs(plain: Any, rtol: float) -> float:
    """Under the stand-in capturer: greedy tokens equal the eager run's (and each chat's alone), every round's logits
    within `rtol` of its largest, one capture per bucket, a same-bucket batch adds no capture, a new bucket captures
    anew. Returns the worst relative logit gap measured."""
    capturer = RecordingCapturer()
    graphed = graphed_generator(plain, capturer).engine
    want_tokens, want_rounds = greedy_rounds(plain.engine, PROMPTS[:3], BUDGETS)
    got_tokens, got_rounds = greedy_rounds(graphed, PROMPTS[:3], BUDGETS)
    assert got_tokens == want_tokens
    assert [len(t) for t in got_tokens] == list(BUDGETS)
    # Each chat alone (its own prefill and decode, eager) gives the same tokens: the batch changed nothing.
    assert [plain.chat([{"role": "user", "content": p}], max_tokens=n, temperature=0).token_ids
            for p, n in zip(PROMPTS[:3], BUDGETS)] == want_tokens
    worst = worst_logit_gap(want_rounds, got_rounds)
    assert worst <= rtol, worst
    stats = graphed.graph_stats
    assert stats["fallbacks"] == 0 and stats["captures"] == capturer.calls >= 3  # buckets 4, 2, 1 at least
    decode_rounds = len(got_rounds) - 1  # the first round prefills every prompt (eager)
    assert stats["replays"] == decode_rounds

    # The same bucket and context widths again (other order, so other rows hold other sequences): replays only.
    captures = stats["captures"]
    again, _ = greedy_rounds(graphed, (PROMPTS[2], PROMPTS[0], PROMPTS[1]), (BUDGETS[2], BUDGETS[0], BUDGETS[1]))
    assert again == [want_tokens[2], want_tokens[0], want_tokens[1]]
    assert graphed.graph_stats["captures"] == captures and capturer.calls == captures
    assert graphed.graph_stats["replays"] == 2 * decode_rounds

    # Five sequences: a bucket not seen yet (8) is captured anew, and its tokens still equal the eager run's.
    five = PROMPTS + ("and a fifth one",)
    assert greedy_rounds(graphed, five, (3,) * 5)[0] == greedy_rounds(plain.engine, five, (3,) * 5)[0]
    assert graphed.graph_stats["captures"] > captures and graphed.graph_stats["fallbacks"] == 0
    assert graphed.decoder.stats()["kv_blocks_in_use"] == 0
    return worst


def eager_and_graphed_on_cuda(folder: Any) -> tuple[Any, Any]:
    """The folder loaded twice on CUDA in float32: eagerly, and with --cuda-graphs (real captures)."""
    from vidloom.core.deploy import DeployConfig
    from vidloom.generator import VideoGenerator

    eager = VideoGenerator.from_pretrained(str(folder), device="cuda", dtype="float32")
    graphed = VideoGenerator.from_pretrained(str(folder), device="cuda", dtype="float32",
                                             deploy=DeployConfig(cuda_graphs=True))
    return eager, graphed


def check_cuda_graphs(eager: Any, graphed: Any, rtol: float) -> float:
    """Real CUDA graphs against the eager CUDA run: the first two greedy tokens of each chat equal (later ones may
    flip on a near-tie of random weights), logits within `rtol` of each round's largest, a second run replaying
    without a capture. Returns the worst relative logit gap measured."""
    want_tokens, want_rounds = greedy_rounds(eager.engine, PROMPTS[:3], BUDGETS)
    got_tokens, got_rounds = greedy_rounds(graphed.engine, PROMPTS[:3], BUDGETS)
    assert [t[:2] for t in got_tokens] == [t[:2] for t in want_tokens]
    worst = worst_logit_gap(want_rounds, got_rounds)
    assert worst <= rtol, worst
    stats = graphed.engine.graph_stats
    assert stats["fallbacks"] == 0 and stats["captures"] >= 3 and stats["replays"] == len(got_rounds) - 1, stats
    captures = stats["captures"]
    again, _ = greedy_rounds(graphed.engine, PROMPTS[:3], BUDGETS)
    assert again == got_tokens  # the replays read this run's buffers, not the capture's
    assert graphed.engine.graph_stats["captures"] == captures and graphed.engine.graph_stats["fallbacks"] == 0
    assert graphed.engine.decoder.stats()["kv_blocks_in_use"] == 0
    return worst
