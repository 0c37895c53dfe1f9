"""The lockstep agreement every rank computes after a command, and how rank failures come back."""

from __future__ import annotations

import pickle

import pytest

from vidloom.core.errors import Cancelled, InvalidRequest, NonFiniteOutput, WorkerFailed
from vidloom.core.output import ProgressEvent
from vidloom.runtime.parallel.messages import RankFailure
from vidloom.runtime.parallel.rank import RankStatus, agree

EVENTS = (ProgressEvent("r", "denoise", 1, 3),)


def _fail(rank: int, kind: str = "Cancelled", message: str = "request r was cancelled") -> RankFailure:
    return RankFailure(rank, kind, message)


def test_all_ranks_fine():
    reply = agree(True, {"video": 1}, EVENTS, [RankStatus(None, None), RankStatus(None, None)])
    assert reply.done and reply.outputs == {"video": 1} and reply.events == EVENTS and not reply.fatal


def test_the_same_error_everywhere_fails_the_request_only():
    reply = agree(False, None, (), [RankStatus(_fail(0), None), RankStatus(_fail(1), None)])
    assert reply.failure == _fail(0) and not reply.fatal
    assert isinstance(reply.failure.to_exception(), Cancelled)


def test_an_error_on_one_rank_breaks_the_pool():
    reply = agree(False, None, (), [RankStatus(None, None), RankStatus(_fail(1, "RuntimeError", "oom"), None)])
    assert reply.fatal and reply.failure.rank == 1


def test_different_errors_break_the_pool():
    # e.g. both ranks timed out in a collective, each naming its own peer
    statuses = [RankStatus(_fail(0, "RuntimeError", "peer 1"), None), RankStatus(_fail(1, "RuntimeError", "peer 0"), None)]
    assert agree(False, None, (), statuses).fatal


def test_lockstep_records_must_match():
    same = ("step r start=True cancel=False", "denoise 1/3 timestep=[999.0]")
    fine = agree(False, None, (), [RankStatus(None, same), RankStatus(None, same)])
    assert not fine.fatal
    other = (same[0], "denoise 1/3 timestep=[998.0]")
    reply = agree(False, None, (), [RankStatus(None, same), RankStatus(None, same), RankStatus(None, other)])
    assert reply.fatal and reply.failure.rank == 2 and reply.failure.kind == "LockstepError"
    assert "rank 0 ran [denoise 1/3 timestep=[999.0]], rank 2 ran [denoise 1/3 timestep=[998.0]]" in reply.failure.message


@pytest.mark.parametrize("exc, kind", [
    (InvalidRequest("height", "too big"), InvalidRequest),
    (NonFiniteOutput("NaN latents"), NonFiniteOutput),
    (Cancelled("request r was cancelled"), Cancelled),
])
def test_vidloom_errors_come_back_as_themselves(exc, kind):
    rebuilt = pickle.loads(pickle.dumps(RankFailure.of(0, exc))).to_exception()
    assert type(rebuilt) is kind and str(rebuilt) == str(exc)


def test_other_errors_come_back_as_worker_failed_naming_the_rank():
    rebuilt = RankFailure.of(1, RuntimeError("shape mismatch")).to_exception()
    assert isinstance(rebuilt, WorkerFailed) and str(rebuilt) == "rank 1: RuntimeError: shape mismatch"
    assert pickle.loads(pickle.dumps(rebuilt)).rank == 1
