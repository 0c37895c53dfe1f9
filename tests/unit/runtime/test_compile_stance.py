"""Held compile stances: the strongest held is in force, and out-of-order exits never leave one set."""

from __future__ import annotations

import pytest
import torch

from vidloom.runtime.compile_stance import compile_stance, held_stances


def _stance() -> str:
    return torch._dynamo.eval_frame._stance.stance


def test_torch_set_stance_exited_out_of_order_leaks_what_compile_stance_does_not():
    # The leak this module exists for, shown on torch's own objects (two engines' steps overlapping on two threads).
    a, b = torch.compiler.set_stance("force_eager"), torch.compiler.set_stance("eager_on_recompile")
    a.__exit__(None, None, None)
    b.__exit__(None, None, None)
    assert _stance() == "force_eager", "torch restores what each saw when built: the first engine's stance stays"
    torch.compiler.set_stance("default")
    outer, inner = compile_stance("force_eager"), compile_stance("eager_on_recompile")
    outer.__enter__()
    inner.__enter__()
    assert _stance() == "force_eager", "the strongest held stance is in force"
    outer.__exit__(None, None, None)
    assert _stance() == "eager_on_recompile" and held_stances() == ("eager_on_recompile",)
    inner.__exit__(None, None, None)
    assert _stance() == "default" and held_stances() == ()


def test_the_stance_from_before_comes_back_and_a_failing_body_releases_its_hold():
    with torch.compiler.set_stance("eager_on_recompile"):
        with pytest.raises(RuntimeError, match="boom"), compile_stance("force_eager"):
            assert _stance() == "force_eager"
            raise RuntimeError("boom")
        assert _stance() == "eager_on_recompile" and held_stances() == ()
    assert _stance() == "default"


def test_a_stance_is_set_on_entry_only_so_a_scope_never_entered_changes_nothing():
    scope = compile_stance("force_eager")  # built, never entered (a later context manager in the line raised)
    assert _stance() == "default" and scope is not None
    with pytest.raises(ValueError, match="'fail_on_recompile' is not one of"):
        with compile_stance("fail_on_recompile"):
            pass
