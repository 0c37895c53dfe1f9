"""Flux2 Klein: every key of Flux2KleinPipeline (model_index.json), Flux2Transformer2DModel, AutoencoderKLFlux2
and FlowMatchEulerDiscreteScheduler is read or refused."""

from __future__ import annotations

import pytest

diffusers = pytest.importorskip("diffusers")

from vidloom.core.errors import CheckpointError  # noqa: E402
from vidloom.families.flux2 import transformer as flux2_transformer, vae as flux2_vae  # noqa: E402
from vidloom.families.flux2 import schedule as flux2_schedule  # noqa: E402
from vidloom.families.flux2.cards import INDEX_COMPONENTS, INDEX_SETTINGS  # noqa: E402
from vidloom.loading.key_policy import KeyPolicy  # noqa: E402
from tests.helpers.config_keys import (  # noqa: E402
    FUTURE_KEY, assert_keys_classified, assert_policy_classified, assert_refused_at_load, assert_refuses_unknown,
)


def test_model_index_keys_are_classified():
    assert_keys_classified(diffusers.Flux2KleinPipeline, (*INDEX_COMPONENTS, *INDEX_SETTINGS))


@pytest.mark.parametrize(("reference", "ours", "read"), [
    (diffusers.Flux2Transformer2DModel, flux2_transformer.CONFIG_KEYS,
     flux2_transformer.Flux2TransformerConfig.from_diffusers),
    (diffusers.AutoencoderKLFlux2, flux2_vae.FLUX2_VAE_POLICY, flux2_vae.Flux2VAEConfig.from_diffusers),
    (diffusers.FlowMatchEulerDiscreteScheduler, flux2_schedule.CONFIG_KEYS, flux2_schedule.Flux2Schedule.from_diffusers),
], ids=lambda v: getattr(v, "__name__", ""))
def test_component_keys_are_classified(reference, ours, read):
    if isinstance(ours, KeyPolicy):
        assert_policy_classified(reference, ours)
    else:
        assert_keys_classified(reference, ours)
    assert_refuses_unknown(read, {"use_dynamic_shifting": True}, errors=(CheckpointError,))


def test_unknown_model_index_key_is_refused_at_load(flux2_distilled_dir, tmp_path):
    folder = tmp_path / "future"
    assert_refused_at_load(flux2_distilled_dir, folder, **{FUTURE_KEY: "x"},
                           match=rf"{folder}/model_index.json: unsupported config key\(s\) {FUTURE_KEY}")


def test_is_distilled_must_be_a_bool(flux2_distilled_dir, tmp_path):
    # "false" as a string is truthy: CFG would be switched off on a base model.
    assert_refused_at_load(flux2_distilled_dir, tmp_path / "stringly", is_distilled="false",
                           match=r"model_index.json: is_distilled='false' is not valid")


def test_unknown_transformer_key_names_key_and_file(flux2_distilled_dir, tmp_path):
    folder = tmp_path / "dit"
    assert_refused_at_load(flux2_distilled_dir, folder, "transformer/config.json", **{FUTURE_KEY: 1},
                           match=rf"{folder}/transformer/config.json: transformer config: .*{FUTURE_KEY}")


@pytest.mark.parametrize(("read", "key"), [
    (flux2_transformer.Flux2TransformerConfig.from_diffusers, "guidance_embeds"),
    (flux2_vae.Flux2VAEConfig.from_diffusers, "use_quant_conv"),
    (flux2_vae.Flux2VAEConfig.from_diffusers, "use_post_quant_conv"),
    (flux2_vae.Flux2VAEConfig.from_diffusers, "mid_block_add_attention"),
])
def test_a_string_for_a_bool_key_is_refused_by_name(read, key):
    # bool("false") is True: a string here would silently build another network.
    with pytest.raises(CheckpointError, match=f"{key}='false' is not valid"):
        read({key: "false"})
