"""Wan family (Wan2.1 T2V/I2V/FLF2V, Wan2.2 TI2V-5B and A14B, V2V): every reference config key is read or refused.

The reference classes are diffusers' WanPipeline, WanImageToVideoPipeline, WanVideoToVideoPipeline (model_index.json),
WanTransformer3DModel, AutoencoderKLWan and the schedulers our sampler reads (UniPC, FlowMatchEuler).
"""

from __future__ import annotations

import pytest
import torch

diffusers = pytest.importorskip("diffusers")

from vidloom.core.errors import CheckpointError  # noqa: E402
from vidloom.diffusion.sampler import SamplerConfig, make_sampler  # noqa: E402
from vidloom.diffusion.scheduler_keys import SCHEDULER_KEYS  # noqa: E402
from vidloom.models.wan import transformer_config as wan_transformer, vae as wan_vae  # noqa: E402
from vidloom.families.wan.demo import WAN21_SCHEDULER  # noqa: E402
from vidloom.families.wan.load import WAN_INDEX_KEYS  # noqa: E402
from vidloom.families.wan.registered import FASTWAN_PIPELINE  # noqa: E402
from tests.helpers.config_keys import (  # noqa: E402
    FUTURE_KEY, assert_keys_classified, assert_policy_classified, assert_refused_at_load, assert_refuses_unknown,
)

@pytest.mark.parametrize("name", sorted(set(WAN_INDEX_KEYS) - {FASTWAN_PIPELINE}))
def test_model_index_keys_are_classified(name):
    assert_keys_classified(getattr(diffusers, name), WAN_INDEX_KEYS[name])


def test_fastvideo_dmd_pipeline_holds_wan_pipeline_keys():
    # FastVideo's WanDMDPipeline is no diffusers class: its folders are written with WanPipeline's keys.
    assert not hasattr(diffusers, FASTWAN_PIPELINE)
    assert WAN_INDEX_KEYS[FASTWAN_PIPELINE] == WAN_INDEX_KEYS["WanPipeline"]


def test_transformer_keys_are_classified():
    assert_keys_classified(diffusers.WanTransformer3DModel, wan_transformer.CONFIG_KEYS)
    assert_refuses_unknown(wan_transformer.WanTransformerConfig.from_diffusers, errors=(CheckpointError,))


def test_vae_keys_are_classified():
    assert_policy_classified(diffusers.AutoencoderKLWan, wan_vae.WAN_VAE_POLICY)
    assert_refuses_unknown(wan_vae.WanVAEConfig.from_diffusers, errors=(CheckpointError,))


@pytest.mark.parametrize("name", ["UniPCMultistepScheduler", "FlowMatchEulerDiscreteScheduler"])
def test_scheduler_keys_are_classified(name):
    assert_policy_classified(getattr(diffusers, name), SCHEDULER_KEYS[name].policy)
    base = {"_class_name": name, **({"use_flow_sigmas": True, "prediction_type": "flow_prediction"}
                                    if name.startswith("UniPC") else {})}
    assert_refuses_unknown(SamplerConfig.from_diffusers, base, errors=(CheckpointError,))


# Wan2.1-T2V-1.3B-Diffusers ships UniPC with flow_shift 3.0 (480p); 5.0 is the 720p / TI2V value and 12.0 the
# registered A14B T2V card's default.
@pytest.mark.parametrize("shift", [3.0, 5.0, 12.0])
def test_published_unipc_config_loads_whole_and_schedules_like_the_reference(shift):
    ref = diffusers.UniPCMultistepScheduler.from_config({**WAN21_SCHEDULER, "flow_shift": shift})
    # Every key the reference holds (newer diffusers add some), as save_pretrained writes them.
    ours = make_sampler("unipc", SamplerConfig.from_diffusers({**ref.config, "_class_name": ref.__class__.__name__}))
    for steps in (4, 40, 50):
        ref.set_timesteps(steps)
        schedule = ours.schedule(steps)
        assert torch.equal(schedule.timesteps, ref.timesteps) and torch.equal(schedule.sigmas, ref.sigmas)


def test_unknown_model_index_key_is_refused_at_load(tiny_wan_dir, tmp_path):
    folder = tmp_path / "future"
    assert_refused_at_load(tiny_wan_dir, folder, **{FUTURE_KEY: 1.0},
                           match=rf"{folder}/model_index.json: unsupported config key\(s\) {FUTURE_KEY}")


def test_expand_timesteps_must_be_a_bool(tiny_wan_dir, tmp_path):
    # "false" as a string would be truthy: the TI2V per-token path would run on a Wan2.1 checkpoint.
    assert_refused_at_load(tiny_wan_dir, tmp_path / "stringly", expand_timesteps="false",
                           match=r"model_index.json: expand_timesteps='false' is not valid")


def test_image_encoder_without_image_dim_is_refused(tiny_wan_dir, tmp_path):
    assert_refused_at_load(tiny_wan_dir, tmp_path / "clip", _class_name="WanImageToVideoPipeline",
                           image_encoder=["transformers", "CLIPVisionModel"], image_processor=[None, None],
                           match=r"model_index.json: image_encoder is listed, but .* no image_dim")


def test_unknown_component_config_key_names_key_and_file(tiny_wan_dir, tmp_path):
    folder = tmp_path / "future_vae"
    assert_refused_at_load(tiny_wan_dir, folder, "vae/config.json", **{FUTURE_KEY: True},
                           match=rf"{folder}/vae/config.json: VAE config: .*{FUTURE_KEY}")


@pytest.mark.parametrize(("read", "key"), [
    (wan_transformer.WanTransformerConfig.from_diffusers, "cross_attn_norm"),
    (wan_vae.WanVAEConfig.from_diffusers, "is_residual"),
])
def test_a_string_for_a_bool_key_is_refused_by_name(read, key):
    # bool("false") is True: a string here would silently build another network.
    with pytest.raises(CheckpointError, match=f"{key}='false' is not valid"):
        read({key: "false"})
