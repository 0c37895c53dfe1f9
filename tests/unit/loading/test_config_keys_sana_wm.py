"""SANA-WM: every key of SanaWMTransformer3DModel is read, harmless or refused by value (the VAE is LTX-2's
AutoencoderKLLTX2Video, checked in test_config_keys_ltx2)."""

from __future__ import annotations

import pytest

diffusers = pytest.importorskip("diffusers")

from vidloom.core.errors import CheckpointError  # noqa: E402
from vidloom.loading.key_policy import recording_accepted_keys  # noqa: E402
from vidloom.families.sana_wm.config import TRANSFORMER_POLICY, SanaWMConfig  # noqa: E402
from vidloom.families.sana_wm.demo import DEMO_TRANSFORMER  # noqa: E402
from tests.helpers.config_keys import assert_policy_classified, assert_refuses_unknown  # noqa: E402


def test_transformer_keys_are_classified():
    assert_policy_classified(diffusers.SanaWMTransformer3DModel, TRANSFORMER_POLICY)
    assert_refuses_unknown(SanaWMConfig.from_diffusers, errors=(CheckpointError,))


def test_released_defaults_read_and_record_the_unused_keys():
    # NVIDIA's converter saves SanaWMTransformer3DModel() as is: its config.json holds every default.
    saved = dict(diffusers.SanaWMTransformer3DModel.from_config(DEMO_TRANSFORMER).config)
    with recording_accepted_keys() as met:
        config = SanaWMConfig.from_diffusers(saved)
    assert config.hidden_size == DEMO_TRANSFORMER["hidden_size"]
    assert sorted(m.key for m in met) == sorted(TRANSFORMER_POLICY.harmless)


def test_mlp_acts_refused_by_value():
    with pytest.raises(CheckpointError, match=r"mlp_acts=\['gelu', 'gelu', None\] is not supported"):
        SanaWMConfig.from_diffusers({"mlp_acts": ["gelu", "gelu", None]})
