"""Scheduler policies with fake items (no model, no torch)."""

from dataclasses import dataclass

import pytest

from vidloom.runtime.scheduler import POLICIES, QueueFull, Scheduler


@dataclass
class Job:
    key: str
    steps: int


def drive(scheduler: Scheduler) -> list[str]:
    """Run every job to completion, returning the order in which steps ran."""
    trace = []
    while True:
        scheduler.admit()
        job = scheduler.pick()
        if job is None:
            return trace
        trace.append(job.key)
        job.steps -= 1
        if job.steps == 0:
            scheduler.remove(job.key)


def test_fifo_runs_each_job_to_completion():
    s = Scheduler("fifo", slots=2, queue_size=10)
    for key, steps in (("long", 3), ("short", 1)):
        s.enqueue(Job(key, steps))
    assert drive(s) == ["long", "long", "long", "short"]


def test_interleave_round_robins_resident_jobs():
    s = Scheduler("interleave", slots=2, queue_size=10)
    for key, steps in (("long", 4), ("short", 2), ("late", 1)):
        s.enqueue(Job(key, steps))
    # "late" waits for a free slot, then joins the rotation.
    assert drive(s) == ["long", "short", "long", "short", "late", "long", "long"]


def test_short_job_finishes_early_under_interleave():
    s = Scheduler("interleave", slots=2, queue_size=10)
    s.enqueue(Job("fifty", 50))
    s.enqueue(Job("four", 4))
    trace = drive(s)
    assert len(trace) - trace[::-1].index("four") <= 8  # done within its first 8 turns


def test_queue_bound_rejects_at_once():
    s = Scheduler("fifo", slots=1, queue_size=2)
    s.enqueue(Job("a", 1))
    s.enqueue(Job("b", 1))
    with pytest.raises(QueueFull):
        s.enqueue(Job("c", 1))
    s.admit()  # a becomes resident, freeing a queue place
    s.enqueue(Job("c", 1))
    assert (s.resident, s.waiting) == (1, 2)


def test_remove_waiting_and_resident():
    s = Scheduler("interleave", slots=1, queue_size=5)
    for key in "abc":
        s.enqueue(Job(key, 2))
    s.admit()
    assert s.is_waiting("b") and s.remove("b").key == "b" and not s.is_waiting("b")
    assert s.remove("a").key == "a"
    assert s.remove("zzz") is None
    assert drive(s) == ["c", "c"]


def test_bad_configuration():
    with pytest.raises(ValueError, match="fifo, interleave"):
        Scheduler("lifo")
    with pytest.raises(ValueError):
        Scheduler("fifo", slots=0)


def test_batch_groups_residents_with_equal_keys_oldest_first_up_to_the_limit():
    s = Scheduler("batch", slots=5, queue_size=5)
    for key in "abcde":
        s.enqueue(Job(key, 1))
    s.admit()
    keys = {"a": "x", "b": "y", "c": "x", "d": "x", "e": None}
    first = s.pick()
    assert first.key == "a"
    assert [j.key for j in s.group(first, keys, max_size=3)] == ["a", "c", "d"]
    assert [j.key for j in s.group(first, keys, max_size=2)] == ["a", "c"]
    b = s.residents()[1]
    assert [j.key for j in s.group(b, keys, max_size=4)] == ["b"]  # nobody shares its key
    e = s.residents()[4]
    assert [j.key for j in s.group(e, {**keys, "a": None}, max_size=4)] == ["e"]  # None never groups


def test_batch_picks_round_robin_like_interleave():
    s = Scheduler("batch", slots=2, queue_size=2)
    s.enqueue(Job("a", 2))
    s.enqueue(Job("b", 1))
    assert drive(s) == ["a", "b", "a"]


@dataclass
class Chat:
    key: str
    decoder: bool = True


def test_chats_take_decode_slots_share_the_queue_and_are_never_picked():
    s = Scheduler("interleave", slots=1, queue_size=3, decode_slots=2)
    for item in (Job("video", 3), Chat("a"), Job("late", 1)):
        s.enqueue(item)
    with pytest.raises(QueueFull):
        s.enqueue(Chat("b"))  # one queue bounds both kinds
    # A full kind does not block the other: "late" waits for the video's slot, the chats take decode slots.
    assert [i.key for i in s.admit()] == ["video", "a"]
    s.enqueue(Chat("b"))
    assert [i.key for i in s.admit()] == ["b"]
    assert (s.resident, s.resident_of(True), s.resident_of(False), s.waiting) == (3, 2, 1, 1)
    assert [s.pick().key for _ in range(3)] == ["video"] * 3  # chats step in the decode batch, not by turns
    s.remove("a")
    s.enqueue(Chat("c"))
    assert [i.key for i in s.admit()] == ["c"]
    s.remove("video")
    assert [i.key for i in s.admit()] == ["late"] and s.pick().key == "late"


@dataclass
class Reasoning:
    key: str
    decoding: bool = True  # a generation request whose reasoner is writing its prompt


@pytest.mark.parametrize("policy", POLICIES)
def test_a_round_decodes_every_sequence_together_and_gives_the_turn_to_a_request_that_is_not_decoding(policy):
    s = Scheduler(policy, slots=2, queue_size=4)
    reasoning, video, chat = Reasoning("reasoning"), Job("video", 9), Chat("chat")
    for item in (reasoning, video, chat):
        s.enqueue(item)
    s.admit()
    decode, picked = s.round()
    assert [i.key for i in decode] == ["reasoning", "chat"]  # one forward, oldest first
    # fifo keeps the oldest's turn (its decode steps are its work); the others give it to the next request.
    assert picked is (None if policy == "fifo" else video)
    reasoning.decoding = False  # its prompt is written: it denoises by turns now
    decode, picked = s.round()
    assert [i.key for i in decode] == ["chat"] and picked is not None
    assert picked is reasoning if policy == "fifo" else picked in (reasoning, video)


def test_chats_and_videos_are_admitted_against_one_memory_ledger():
    """A chat holds its working set on the same ledger as a video: what one holds, the other cannot take; an
    item that does not fit holds back its own kind only."""
    from vidloom.runtime.admission import MemoryAdmission

    ledger = MemoryAdmission(100)
    sizes = {"chat": 40, "video": 70, "chat2": 30, "small": 10}

    def fits(item) -> bool:
        return ledger.try_reserve(item.key, sizes[item.key], "chat" if getattr(item, "decoder", False) else "request")

    s = Scheduler("fifo", slots=2, queue_size=8, decode_slots=4)
    s.enqueue(Chat("chat"))
    assert [i.key for i in s.admit(fits)] == ["chat"] and ledger.held_by("chat") == 40
    s.enqueue(Job("video", 1))
    s.enqueue(Job("small", 1))  # fits, but waits behind the video it would overtake
    s.enqueue(Chat("chat2"))  # another kind: not held back by the video
    assert [i.key for i in s.admit(fits)] == ["chat2"] and s.waiting == 2  # 40 + 30 held: 70 does not fit
    ledger.release("chat")
    s.remove("chat")
    assert [i.key for i in s.admit(fits)] == ["video"]  # 30 + 70 = 100, exactly the budget
    assert s.waiting == 1 and ledger.in_use == 100


@dataclass
class Talker:
    key: str
    waiting: bool = True  # its talker found the paged KV pool busy: it retries in the decode pass


@pytest.mark.parametrize("policy", POLICIES)
def test_a_request_waiting_for_kv_retries_in_every_decode_pass_and_takes_no_turn(policy):
    s = Scheduler(policy, slots=2, queue_size=4)
    waiter, holder = Talker("waiter"), Job("holder", 9)  # under fifo too: the younger one may hold the blocks
    for item in (waiter, holder):
        s.enqueue(item)
    s.admit()
    decode, picked = s.round()
    assert decode == [waiter] and picked is holder
    waiter.waiting = False  # it got its blocks
    decode, picked = s.round()
    assert decode == [] and picked is (waiter if policy == "fifo" else holder)
