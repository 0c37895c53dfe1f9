"""Engine, ParallelEngine and AsyncEngine implement the one engine interface (EngineAPI), and every request kind
enters each of them through `submit`."""

from __future__ import annotations

import pytest
import torch

from tests.unit.runtime.test_engine import CountingLoop, _engine
from vidloom.core.chat import ChatMessage, ChatPart, ChatRequest
from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import Cancelled, InvalidRequest
from vidloom.core.parallel import ParallelPlan, SequenceGeometry, TokenLayout
from vidloom.core.request import GenerationRequest
from vidloom.core.speech import SpeechRequest
from vidloom.families.wan.demo import demo_card
from vidloom.runtime.async_engine import AsyncEngine
from vidloom.runtime.engine import Engine
from vidloom.runtime.interface import EngineAPI
from vidloom.runtime.parallel.engine import ParallelEngine, PoolInstance

MEMBERS = {name for name in vars(EngineAPI) if not name.startswith("_")} | set(EngineAPI.__annotations__)


class NoWorkers:
    """A transport no test reaches: requests are refused or cancelled before a rank is contacted."""

    epoch, broken = 1, False

    def call(self, command):
        raise AssertionError("a worker was contacted")

    def close(self) -> None:
        pass


def _pool() -> ParallelEngine:
    deploy = DeployConfig(devices=2, parallel=ParallelPlan(sp=2))
    grid = SequenceGeometry(num_heads=4, patch_size=(1, 2, 2), vae_spatial=8, vae_temporal=4)
    instance = PoolInstance(demo_card(), deploy, torch.device("cpu"), "unused")
    return ParallelEngine(NoWorkers(), instance, TokenLayout(4, ("video",), grid=grid))  # type: ignore[arg-type]


@pytest.fixture
def engines():
    one, pool = _engine(CountingLoop()), _pool()
    fronts = [AsyncEngine(one), AsyncEngine(pool)]
    yield {"Engine": one, "ParallelEngine": pool, "AsyncEngine(Engine)": fronts[0], "AsyncEngine(ParallelEngine)":
           fronts[1]}
    for front in fronts:
        front.close()


def test_every_engine_is_an_engine_api_with_the_same_members(engines):
    assert MEMBERS >= {"instance", "card", "decoder", "caches", "estimator", "submit", "cancel", "close"}
    for name, engine in engines.items():
        assert isinstance(engine, EngineAPI), name
        assert {m for m in MEMBERS if hasattr(engine, m)} == MEMBERS, name
    for cls in (Engine, ParallelEngine, AsyncEngine):  # methods and properties on the class, not patched in
        assert {m for m in MEMBERS if hasattr(cls, m)} >= MEMBERS - set(EngineAPI.__annotations__), cls.__name__


def test_the_async_engine_shows_the_engine_it_steps(engines):
    for inner, front in ((engines["Engine"], engines["AsyncEngine(Engine)"]),
                         (engines["ParallelEngine"], engines["AsyncEngine(ParallelEngine)"])):
        for member in ("instance", "card", "decoder", "caches", "estimator", "compile_misses"):
            assert getattr(front, member) is getattr(inner, member), member
    assert engines["ParallelEngine"].decoder is None and engines["ParallelEngine"].caches is None
    assert engines["Engine"].caches is not None


def test_kinds_an_engine_cannot_run_are_refused_at_submit_naming_the_model(engines):
    chat = ChatRequest((ChatMessage("user", (ChatPart("text", "hi"),)),))
    speech = SpeechRequest(text="hello")
    for name, engine in engines.items():
        for work, says in ((chat, "does not support chat"), (speech, "cannot speak")):
            with pytest.raises(InvalidRequest, match=says) as info:
                engine.submit(work)
            assert info.value.field == "model", name


def test_a_sync_engine_cancels_a_started_run_by_its_id(engines):
    for engine in (engines["Engine"], engines["ParallelEngine"]):
        run = engine.submit(GenerationRequest("p", height=48, width=48, num_frames=5, num_inference_steps=3, seed=1))
        assert engine.cancel(run.request.request_id) and not engine.cancel("unknown")
        assert run.cancel.cancelled  # (a pool's ranks read it with the next unit)
    with pytest.raises(Cancelled):
        run = engines["Engine"].submit(GenerationRequest("p", num_inference_steps=3, seed=1))
        engines["Engine"].cancel(run.request.request_id)
        run.finish()


def test_a_request_the_caller_resolved_is_resolved_once(engines, monkeypatch):
    """The server resolves a request at its boundary (its limits read the resolved fields): the engine takes it
    as resolved instead of resolving it again; a plain submit resolves it in the engine."""
    import vidloom.runtime.engine as engine_module

    resolve, calls = engine_module.resolve_request, []
    monkeypatch.setattr(engine_module, "resolve_request",
                        lambda r, card: calls.append(r.request_id) or resolve(r, card))
    front, card = engines["AsyncEngine(Engine)"], engines["Engine"].card
    resolved = resolve(GenerationRequest("p", num_inference_steps=2, seed=1), card)
    assert front.submit(resolved, result=lambda out: out["video"], resolved=True).wait(30) == 12.0 and calls == []
    plain = GenerationRequest("p", num_inference_steps=2, seed=1)
    assert front.submit(plain, result=lambda out: out["video"]).wait(30) == 12.0 and calls == [plain.request_id]
