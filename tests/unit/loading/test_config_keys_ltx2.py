"""LTX-2: every key of the LTX2 pipelines (model_index.json) and of each component config is read or refused."""

from __future__ import annotations

import pytest

diffusers = pytest.importorskip("diffusers")

from diffusers.pipelines.ltx2.connectors import LTX2TextConnectors  # noqa: E402
from diffusers.pipelines.ltx2.latent_upsampler import LTX2LatentUpsamplerModel  # noqa: E402
from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder, LTX2VocoderWithBWE  # noqa: E402

from vidloom.core.errors import CheckpointError  # noqa: E402
from vidloom.models.ltx2.audio_vae import AUDIO_VAE_POLICY, LTX2AudioVAEConfig  # noqa: E402
from vidloom.models.ltx2.connectors import CONNECTORS_POLICY, LTX2ConnectorsConfig  # noqa: E402
from vidloom.models.ltx2.transformer import TRANSFORMER_POLICY, LTX2TransformerConfig  # noqa: E402
from vidloom.models.ltx2.upsampler import UPSAMPLER_POLICY, LTX2LatentUpsamplerConfig  # noqa: E402
from vidloom.models.ltx2.video_vae import VIDEO_VAE_POLICY, LTX2VideoVAEConfig  # noqa: E402
from vidloom.models.ltx2.vocoder import BWE_CLASS, PLAIN_CLASS, LTX2VocoderConfig  # noqa: E402
from vidloom.families.ltx2.cards import INDEX_COMPONENTS, INDEX_UNSUPPORTED  # noqa: E402
from vidloom.families.ltx2.schedule import SCHEDULER_POLICY, LTX2Schedule  # noqa: E402
from tests.helpers.config_keys import (  # noqa: E402
    FUTURE_KEY, assert_keys_classified, assert_policy_classified, assert_refused_at_load, assert_refuses_unknown,
    copy_with_keys,
)


@pytest.mark.parametrize("name", ["LTX2Pipeline", "LTX2ImageToVideoPipeline"])
def test_model_index_keys_are_classified(name):
    # latent_upsampler is ours: the two-stage program reads it from the same folder.
    assert_keys_classified(getattr(diffusers, name), (*INDEX_COMPONENTS, *INDEX_UNSUPPORTED),
                           extra_ok={"latent_upsampler"})


@pytest.mark.parametrize(("reference", "policy", "read"), [
    (diffusers.LTX2VideoTransformer3DModel, TRANSFORMER_POLICY, LTX2TransformerConfig.from_diffusers),
    (diffusers.AutoencoderKLLTX2Video, VIDEO_VAE_POLICY, LTX2VideoVAEConfig.from_diffusers),
    (diffusers.AutoencoderKLLTX2Audio, AUDIO_VAE_POLICY, LTX2AudioVAEConfig.from_diffusers),
    (LTX2TextConnectors, CONNECTORS_POLICY, LTX2ConnectorsConfig.from_diffusers),
    (LTX2LatentUpsamplerModel, UPSAMPLER_POLICY, LTX2LatentUpsamplerConfig.from_diffusers),
    (diffusers.FlowMatchEulerDiscreteScheduler, SCHEDULER_POLICY, LTX2Schedule.from_diffusers),
], ids=lambda v: getattr(v, "__name__", ""))
def test_component_keys_are_classified(reference, policy, read):
    assert_policy_classified(reference, policy)
    assert_refuses_unknown(read, errors=(CheckpointError,))


@pytest.mark.parametrize(("reference", "class_name"), [(LTX2Vocoder, PLAIN_CLASS), (LTX2VocoderWithBWE, BWE_CLASS)])
def test_vocoder_keys_are_classified(reference, class_name):
    assert_keys_classified(reference, LTX2VocoderConfig.config_keys(class_name))
    assert_refuses_unknown(LTX2VocoderConfig.from_diffusers, {"_class_name": class_name}, errors=(CheckpointError,))


def test_unknown_model_index_key_is_refused_at_load(ltx2_dir, tmp_path):
    folder = tmp_path / "future"
    assert_refused_at_load(ltx2_dir, folder, **{FUTURE_KEY: 2},
                           match=rf"{folder}/model_index.json: unsupported config key\(s\) {FUTURE_KEY}")


def test_duration_head_is_refused_by_name(ltx2_dir, tmp_path):
    assert_refused_at_load(ltx2_dir, tmp_path / "duration", duration_head=["ltx2", "LTX2DurationHead"],
                           match=r"model_index.json: component 'duration_head' is not supported")


def test_absent_optional_components_load(ltx2_dir, tmp_path):
    # diffusers writes [null, null] for optional components a pipeline was saved without.
    from vidloom.families.ltx2.cards import check_pipeline
    from vidloom.loading.diffusers_dir import DiffusersDir

    folder = copy_with_keys(ltx2_dir, tmp_path / "optional", duration_head=[None, None], processor=[None, None],
                            prompt_enhancer=[None, None])
    check_pipeline(DiffusersDir.open(folder))


def test_unknown_scheduler_key_names_key_and_file(ltx2_dir, tmp_path):
    folder = tmp_path / "sched"
    assert_refused_at_load(ltx2_dir, folder, "scheduler/scheduler_config.json", **{FUTURE_KEY: 0.5},
                           match=rf"{folder}/scheduler/scheduler_config.json: .*{FUTURE_KEY}")
