"""max_request_seconds: the measured pace refuses up front, the running clock stops a run (#40)."""

from __future__ import annotations

import asyncio

import pytest

from vidloom.core.errors import LimitExceeded
from vidloom.serving.errors import APIError
from vidloom.serving.request_budget import RequestBudget


def test_nothing_is_refused_up_front_before_a_pace_is_measured():
    budget = RequestBudget(10.0)
    budget.check("speech", 10**6, "input", "characters")  # no pace yet: only the running clock applies


def test_the_measured_pace_refuses_what_cannot_fit():
    budget = RequestBudget(10.0)
    budget.observe("speech", 100, 2.0)  # 0.02 s a character
    budget.check("speech", 400, "input", "characters")  # 8 s
    with pytest.raises(LimitExceeded) as info:
        budget.check("speech", 600, "input", "characters")  # 12 s
    assert info.value.field == "input" and info.value.limit == "max_request_seconds"
    assert "600 characters would take about 12 s" in str(info.value) and "(max_request_seconds)" in str(info.value)
    budget.check("audio_chat", 10**6, "max_tokens", "tokens")  # each kind has its own pace


def test_the_pace_is_a_moving_average():
    budget = RequestBudget(None)
    budget.observe("speech", 10, 1.0)
    budget.observe("speech", 10, 2.0)
    assert budget.pace("speech") == pytest.approx(0.7 * 0.1 + 0.3 * 0.2)
    budget.check("speech", 10**9, "input", "characters")  # no budget: never refused


def test_a_run_past_the_budget_is_cancelled_and_a_504():
    budget, cancelled = RequestBudget(0.05), []

    async def slow() -> int:
        await asyncio.sleep(5)
        return 1

    with pytest.raises(APIError) as info:
        asyncio.run(budget.run("speech", lambda _: 1, slow(), lambda: cancelled.append(True)))
    assert info.value.status == 504 and info.value.code == "deadline_exceeded" and cancelled == [True]
    assert "max_request_seconds" in info.value.message
    assert budget.pace("speech") is None  # a stopped run measures nothing


def test_a_finished_run_measures_its_pace():
    budget = RequestBudget(5.0)

    async def quick() -> str:
        return "done"

    assert asyncio.run(budget.run("speech", lambda value: len(value), quick(), lambda: None)) == "done"
    assert budget.pace("speech") is not None and budget.pace("speech") < 1.0
