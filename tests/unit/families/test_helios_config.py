"""Helios configs: every transformer and scheduler key is read or refused by name; what the reference cannot run
(or runs with a key it never uses) is a CheckpointError naming that key."""

from __future__ import annotations

import pytest

from vidloom.core.errors import CheckpointError
from vidloom.families.helios.config import HeliosTransformerConfig
from vidloom.families.helios.demo import DEMO_SCHEDULER, DEMO_TRANSFORMER
from vidloom.families.helios.schedule import HeliosSchedule


@pytest.mark.parametrize(("key", "value"), [
    ("added_kv_proj_dim", 32), ("patch_size", [1, 4, 4]), ("qk_norm", "layer_norm"),
    ("history_scale_mode", "per_token"), ("window_size", [-1, -1]),
])
def test_a_transformer_key_we_cannot_run_is_refused_by_name(key, value):
    with pytest.raises(CheckpointError, match=key):
        HeliosTransformerConfig.from_diffusers({**DEMO_TRANSFORMER, key: value})


def test_rope_dim_must_fill_the_head():
    with pytest.raises(CheckpointError, match="rope_dim"):
        HeliosTransformerConfig.from_diffusers({**DEMO_TRANSFORMER, "rope_dim": [4, 4, 4]})


@pytest.mark.parametrize(("key", "value"), [
    ("stages", 3), ("scheduler_type", "dmd"), ("solver_type", "bh1"), ("prediction_type", "epsilon"),
    ("lower_order_final", False), ("thresholding", True), ("shift", 3.0),
])
def test_a_scheduler_key_the_base_pipeline_cannot_run_is_refused_by_name(key, value):
    with pytest.raises(CheckpointError, match=key):
        HeliosSchedule.from_diffusers({**DEMO_SCHEDULER, key: value})  # shift: refused beside the dynamic shift


def test_the_static_shift_is_ignored_without_the_dynamic_shift():
    plain = HeliosSchedule.from_diffusers({**DEMO_SCHEDULER, "use_dynamic_shifting": False})
    shifted = HeliosSchedule.from_diffusers({**DEMO_SCHEDULER, "use_dynamic_shifting": False, "shift": 3.0})
    assert plain == shifted
    sigmas = plain.schedule(4, 100).sigmas
    assert sigmas.tolist() == pytest.approx([0.999, 0.74925, 0.4995, 0.24975, 0.0])


def test_the_dynamic_shift_grows_with_the_chunk():
    schedule = HeliosSchedule.from_diffusers(DEMO_SCHEDULER)
    small, large = schedule.schedule(4, 256).sigmas, schedule.schedule(4, 4096).sigmas
    assert small[0] < large[0] and small[-1] == large[-1] == 0.0
