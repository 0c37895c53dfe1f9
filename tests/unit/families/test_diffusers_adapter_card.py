"""The adapter's card: read from model_index.json and the pipeline's __call__ signature, without loading weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vidloom import registry
from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import CheckpointError, DeployError, InvalidRequest
from vidloom.core.request import GenerationRequest, Task
from vidloom.media.request_inputs import resolve_request
from vidloom.families.diffusers_adapter.cards import FAMILY, REASON
from vidloom.families.diffusers_adapter.signature import pipeline_class, read_shape
from vidloom.generator import build_request

pytest.importorskip("diffusers")


def _folder(tmp_path: Path, class_name: str, configs: dict[str, dict]) -> Path:
    """A pipeline folder with only model_index.json and component configs (the card reads nothing else)."""
    index = {"_class_name": class_name, "_diffusers_version": "0.42.1"}
    for name, config in configs.items():
        index[name] = ["diffusers", config.get("_class_name", "X")]
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(config))
    (tmp_path / "model_index.json").write_text(json.dumps(index))
    return tmp_path


COGVIDEOX = {
    "transformer": {"_class_name": "CogVideoXTransformer3DModel", "patch_size": 2, "sample_height": 60,
                    "sample_width": 90, "sample_frames": 49},
    "vae": {"_class_name": "AutoencoderKLCogVideoX", "block_out_channels": [128, 256, 256, 512],
            "temporal_compression_ratio": 4},
}
MOCHI = {
    "transformer": {"_class_name": "MochiTransformer3DModel", "patch_size": 2},
    "vae": {"_class_name": "AutoencoderKLMochi", "spatial_expansions": [2, 2, 2], "temporal_expansions": [1, 2, 3]},
}


def test_cogvideox_card_takes_what_its_signature_takes_with_its_defaults(tmp_path):
    card = registry.resolve_card(_folder(tmp_path, "CogVideoXPipeline", COGVIDEOX))
    assert card.family == FAMILY and card.tasks == {Task.T2V}
    d = card.sampling_defaults
    assert (d.height, d.width, d.num_frames, d.num_inference_steps, d.guidance_scale) == (480, 720, 49, 50, 6.0)
    assert card.geometry.spatial_multiple == 16 and card.geometry.temporal_factor == 4
    assert card.optional_fields == {"negative_prompt", "height", "width", "num_frames", "fps", "num_inference_steps",
                                   "guidance_scale"}
    assert "runtime accelerations do not apply" in card.notes[0]
    assert card.max_prompt_tokens == 226  # the signature's max_sequence_length: prompts are bounded by it


def test_mochi_card_uses_its_vae_expansions_and_signature_frames(tmp_path):
    card = registry.resolve_card(_folder(tmp_path, "MochiPipeline", MOCHI))
    assert card.geometry.spatial_multiple == 16 and card.geometry.temporal_factor == 6
    assert card.sampling_defaults.num_frames == 19 and card.sampling_defaults.num_inference_steps == 64


@pytest.mark.parametrize("name, output, hook", [
    ("CogVideoXPipeline", "video", "callback_on_step_end"), ("QwenImagePipeline", "image", "callback_on_step_end"),
    ("AudioLDMPipeline", "audio", "callback"), ("StableAudioPipeline", "audio", "callback"),
])
def test_output_kind_and_step_hook_come_from_the_class(name, output, hook):
    shape = read_shape(pipeline_class(name))
    assert (shape.output, shape.hook) == (output, hook)


def test_qwen_image_guidance_is_its_true_cfg_scale():
    shape = read_shape(pipeline_class("QwenImagePipeline"))
    assert shape.args["guidance_scale"] == "true_cfg_scale" and shape.defaults["guidance_scale"] == 4.0
    assert "num_frames" not in shape.args


def test_image_to_video_pipelines_require_their_image():
    shape = read_shape(pipeline_class("CogVideoXImageToVideoPipeline"))
    assert "image" in shape.required


@pytest.mark.parametrize("class_name, message", [
    ("LTX2VideoDiffusionDecodePipeline", "takes neither callback_on_step_end nor callback"),  # no hook: no steps, no cancel
    ("NoSuchPipeline", "'NoSuchPipeline' is not a diffusers"),
])
def test_a_pipeline_without_a_step_hook_or_unknown_to_diffusers_is_refused_by_name(tmp_path, class_name, message):
    with pytest.raises(CheckpointError, match=message):
        registry.resolve_card(_folder(tmp_path, class_name, {}))


def test_request_fields_the_pipeline_does_not_take_are_refused_naming_them(tmp_path):
    card = registry.resolve_card(_folder(tmp_path, "CogVideoXPipeline", COGVIDEOX))
    for field, value in (("flow_shift", 3.0), ("sampler", "unipc"), ("step_cache_threshold", 0.1)):
        with pytest.raises(InvalidRequest) as excinfo:
            resolve_request(GenerationRequest(prompt="x", **{field: value}), card)
        assert excinfo.value.field == field and "does not take" in str(excinfo.value)
    # The card's own default is no choice at all: the server fills it on every call.
    resolved = resolve_request(GenerationRequest(prompt="x", sampler="pipeline", num_frames=49), card)
    assert resolved.num_frames == 49


def test_every_runtime_feature_is_refused_at_load_with_the_adapter_reason(tmp_path):
    card = registry.resolve_card(_folder(tmp_path, "CogVideoXPipeline", COGVIDEOX))
    for deploy in (DeployConfig(compile=True), DeployConfig(step_cache="teacache"), DeployConfig(fp8_weights=True),
                   DeployConfig(cfg_mode="batched"), DeployConfig(prompt_cache_size=4)):
        with pytest.raises(DeployError, match=REASON):
            registry.check_deploy(card, deploy)
    # diffusers' own switches (load.py): its attention dispatcher, accelerate's offload hooks on the text encoders
    registry.check_deploy(card, DeployConfig(attention_backend="flash", offload_text_encoder=True))


def test_native_recipes_keep_their_classes():
    assert "Flux2KleinPipeline" in registry.PIPELINES and "CogVideoXPipeline" not in registry.PIPELINES


def test_the_demo_card_states_cogvideox_as_the_signature_reads_it():
    from vidloom.families.diffusers_adapter.demo import DEMO_SHAPE

    assert read_shape(pipeline_class("CogVideoXPipeline")) == DEMO_SHAPE


AUDIOLDM = {  # audioldm-s-full-v2's configs, as far as the card reads them
    "unet": {"_class_name": "UNet2DConditionModel", "sample_size": 128},
    "vae": {"_class_name": "AutoencoderKL", "block_out_channels": [128, 256, 384, 640]},
    "vocoder": {"_class_name": "SpeechT5HifiGan", "sampling_rate": 16000, "upsample_rates": [5, 4, 2, 2, 2]},
}


def test_audioldm_seconds_is_its_audio_length_with_the_pipelines_own_default(tmp_path):
    from vidloom.families.diffusers_adapter.audio import MAX_WINDOWS, length_kwargs

    card = registry.resolve_card(_folder(tmp_path, "AudioLDMPipeline", AUDIOLDM))
    spec = card.audio
    assert card.tasks == {Task.T2A} and spec is not None
    # The pipeline's default: unet sample_size x VAE 8x x 160 samples per mel frame / 16 kHz.
    assert spec.default_seconds == 128 * 8 * (160 / 16000) and spec.max_seconds == MAX_WINDOWS * spec.default_seconds
    assert (spec.sample_rate, spec.min_seconds, spec.takes_start) == (16000, 0.01, False)
    request = resolve_request(GenerationRequest(prompt="rain", task=Task.T2A, seconds=5.0), card)
    assert length_kwargs(read_shape(pipeline_class("AudioLDMPipeline")), request) == {"audio_length_in_s": 5.0}
    for fields, param in (({"seconds_start": 1.0}, "seconds_start"), ({"seconds": 0.005}, "seconds"),
                          ({"seconds": 50.0}, "seconds"), ({"height": 64}, "height")):
        with pytest.raises(InvalidRequest) as err:
            resolve_request(GenerationRequest(prompt="rain", task=Task.T2A, **fields), card)
        assert err.value.field == param


def test_stable_audio_through_the_adapter_ends_its_clip_at_start_plus_seconds(tmp_path):
    from vidloom.families.diffusers_adapter.audio import length_kwargs
    from vidloom.families.diffusers_adapter.cards import adapted_card

    shape = read_shape(pipeline_class("StableAudioPipeline"))
    card = adapted_card("sa", "sa", shape, {"sample_size": 1024}, {"sampling_rate": 44100,
                                                                   "downsampling_ratios": [2, 4, 4, 8, 8]}, ["vae"])
    assert card.audio.max_seconds == card.audio.default_seconds == 1024 * 2048 / 44100 and card.audio.takes_start
    request = resolve_request(GenerationRequest(prompt="rain", task=Task.T2A, seconds=2.0, seconds_start=1.5), card)
    assert length_kwargs(shape, request) == {"audio_end_in_s": 3.5, "audio_start_in_s": 1.5}


def test_an_audio_pipeline_without_a_length_argument_refuses_seconds_by_name():
    import dataclasses

    from vidloom.families.diffusers_adapter.cards import adapted_card

    shape = read_shape(pipeline_class("AudioLDMPipeline"))
    fixed = dataclasses.replace(shape, args={k: v for k, v in shape.args.items() if k != "seconds"})
    card = adapted_card("fixed", "fixed", fixed, {"sample_size": 8}, {}, ["unet"])
    assert card.audio is None and card.tasks == {Task.T2A}
    with pytest.raises(InvalidRequest, match="does not take seconds: its clips have no length to choose") as err:
        build_request(card, "rain", seconds=1.0)
    assert err.value.field == "seconds"
