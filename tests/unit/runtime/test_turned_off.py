"""Which deployed features a request's own step cache or adapters turn off, and why it runs alone under batching."""

from __future__ import annotations

from vidloom.core.deploy import DeployConfig
from vidloom.runtime.turned_off import alone_reason, conflicts

GRAPHS = DeployConfig(cuda_graphs=True, step_cache="fbcache")
COMPILED = DeployConfig(compile=True, compile_backend="eager", cuda_graphs=True)


def test_a_step_cache_wins_over_graphs_and_adapters_over_compile():
    assert list(conflicts(GRAPHS, step_cache=True, graphs=True, adapters=False)) == ["cuda_graphs"]
    off = conflicts(COMPILED, step_cache=False, graphs=True, adapters=True)
    assert "LoRA" in off["cuda_graphs"] and "LoRA" in off["compile"]


def test_nothing_is_off_without_a_conflict():
    assert conflicts(GRAPHS, step_cache=False, graphs=True, adapters=False) == {}
    assert conflicts(COMPILED, step_cache=False, graphs=False, adapters=False) == {}
    assert conflicts(DeployConfig(), step_cache=False, graphs=False, adapters=True) == {}  # eager already


def test_why_a_run_steps_alone():
    assert "fbcache" in alone_reason(GRAPHS, step_cache=True, graphs=True, adapters=False)
    assert "cuda_graphs" in alone_reason(COMPILED, step_cache=False, graphs=True, adapters=False)
    assert "LoRA" in alone_reason(DeployConfig(compile=True, compile_backend="eager"), step_cache=False, graphs=False,
                                  adapters=True)
    assert alone_reason(DeployConfig(), step_cache=False, graphs=False, adapters=True) is None  # adapters batch
