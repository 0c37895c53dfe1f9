"""LTX-2 audio VAE and vocoder configs: diffusers' keys read strictly (a key or value we cannot honour is a
CheckpointError naming it), and checkpoint folders that do not fit refused naming the file or tensor."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from tests.helpers.ltx2_audio_fixtures import (
    AUDIO_VAE_CONFIGS, VOCODER_CONFIGS, audio_latents, build_audio_vae, build_vocoder, save_component,
)
from vidloom.core.errors import CheckpointError
from vidloom.models.ltx2.audio_loading import load_audio_decoders, load_audio_vae, load_vocoder
from vidloom.models.ltx2.audio_vae import LTX2AudioVAEConfig
from vidloom.models.ltx2.vocoder import LTX2VocoderConfig

VAE = {"_class_name": "AutoencoderKLLTX2Audio", "_diffusers_version": "0.42.1", **AUDIO_VAE_CONFIGS["causal-pixel"]}
PLAIN = {"_class_name": "LTX2Vocoder", **VOCODER_CONFIGS["hifigan"][1]}
BWE = {"_class_name": "LTX2VocoderWithBWE", **VOCODER_CONFIGS["bwe"][1]}


def test_configs_read_the_diffusers_keys():
    vae = LTX2AudioVAEConfig.from_diffusers(VAE)
    assert (vae.base_channels, vae.latent_channels, vae.mel_bins, vae.causality_axis) == (16, 4, 16, "height")
    assert vae.latents_per_second == 25.0 and vae.latent_mel_bins == 4
    plain = LTX2VocoderConfig.from_diffusers(PLAIN)
    assert plain.output_sampling_rate == 24000 and plain.generator.hop == 240 and plain.bandwidth_extension is None
    bwe = LTX2VocoderConfig.from_diffusers(BWE)
    assert bwe.output_sampling_rate == 48000 and bwe.bandwidth_extension.extender.hop == 144
    assert bwe.generator.final_act_fn is None  # null in config.json: no final activation, not the default tanh


@pytest.mark.parametrize("config, message", [
    ({**VAE, "use_quant_conv": True}, r"unsupported config key\(s\) use_quant_conv"),
    ({**VAE, "_class_name": "AutoencoderKLLTX2Video"}, "_class_name is 'AutoencoderKLLTX2Video'"),
    ({**VAE, "norm_type": "layer"}, "norm_type='layer' is not supported"),
    ({**VAE, "causality_axis": "time"}, "causality_axis='time' is not supported"),
    ({**VAE, "norm_type": "group"}, "norm_type='group' needs causality_axis='none'"),
    ({**VAE, "ch_mult": [1, 2.5]}, r"ch_mult=\[1, 2.5\] is not valid"),
    ({**VAE, "latent_channels": 0}, "latent_channels=0 is not valid"),
    ({**VAE, "mel_bins": None}, "mel_bins=null is not supported"),
    ({**VAE, "mid_block_add_attention": "yes"}, "mid_block_add_attention='yes' is not valid"),
])
def test_audio_vae_config_refuses_what_it_cannot_honour(config, message):
    with pytest.raises(CheckpointError, match=message):
        LTX2AudioVAEConfig.from_diffusers(config)


@pytest.mark.parametrize("config, message", [
    ({**PLAIN, "bwe_hidden_channels": 8}, r"unsupported config key\(s\) bwe_hidden_channels"),
    ({**PLAIN, "_class_name": "HifiGan"}, "_class_name is 'HifiGan'"),
    ({**PLAIN, "act_fn": "gelu"}, "act_fn='gelu' is not supported"),
    ({**PLAIN, "final_act_fn": "sigmoid"}, "final_act_fn='sigmoid' is not supported"),
    ({**PLAIN, "antialias": True}, "antialias=true is not supported with act_fn='leaky_relu'"),
    ({**PLAIN, "upsample_factors": [6, 5]}, "upsample_kernel_sizes and upsample_factors differ in length"),
    ({**PLAIN, "upsample_kernel_sizes": [11, 11, 16]}, r"pairs \[\(11, 6\)\] differ by an odd number"),
    ({**PLAIN, "hidden_channels": 4}, "hidden_channels=4 cannot be halved 3 times"),
    ({**BWE, "bwe_act_fn": "relu"}, "bwe_act_fn='relu' is not supported"),
    ({**BWE, "hop_length": 40}, "bwe_upsample_factors multiply to 144; hop_length x rate ratio is 120"),
    ({**BWE, "output_sampling_rate": 44100}, "output_sampling_rate=44100 is not a multiple of"),
    ({**BWE, "window_length": 32}, "window_length=32 must equal filter_length=64"),
    ({**BWE, "bwe_in_channels": 32}, "bwe_in_channels=32, expected out_channels x num_mel_channels = 16"),
])
def test_vocoder_config_refuses_what_it_cannot_honour(config, message):
    with pytest.raises(CheckpointError, match=message):
        LTX2VocoderConfig.from_diffusers(config)


def test_a_checkpoint_that_does_not_fit_names_the_tensor(tmp_path: Path):
    folder = save_component(build_vocoder("hifigan"), tmp_path / "vocoder")
    weights = folder / "diffusion_pytorch_model.safetensors"
    tensors = load_file(str(weights))
    del tensors["conv_out.weight"]
    save_file(tensors, str(weights))
    with pytest.raises(CheckpointError, match="missing tensors 'conv_out.weight'"):
        load_vocoder(folder)

    vae_dir = save_component(build_audio_vae("causal-pixel"), tmp_path / "audio_vae")
    config = json.loads((vae_dir / "config.json").read_text())
    (vae_dir / "config.json").write_text(json.dumps({**config, "base_channels": 8}))  # weights say 16
    with pytest.raises(CheckpointError, match=r"tensor .decoder\.conv_in\.conv\.\w+. has shape"):
        load_audio_vae(vae_dir)


def test_the_audio_vae_encoder_is_left_unread(tmp_path: Path):
    vae = load_audio_vae(save_component(build_audio_vae("causal-pixel"), tmp_path / "audio_vae"))
    assert not any(name.startswith("encoder.") for name in vae.state_dict())


def test_audio_vae_and_vocoder_must_fit_together(tmp_path: Path):
    save_component(build_audio_vae("causal-pixel"), tmp_path / "audio_vae")  # 2 x 16 mel features
    save_component(build_vocoder("hifigan"), tmp_path / "vocoder")  # reads 32
    vae, vocoder = load_audio_decoders(tmp_path)
    assert vae.decode(audio_latents("causal-pixel", 3)).shape[1:] == (2, 9, 16) and vocoder.sample_rate == 24000
    save_component(build_audio_vae("width-three-stages"), tmp_path / "audio_vae")
    wide = json.loads((tmp_path / "audio_vae" / "config.json").read_text())
    (tmp_path / "audio_vae" / "config.json").write_text(json.dumps({**wide, "mel_bins": 32, "base_channels": 8}))
    with pytest.raises(CheckpointError, match=r"vocoder/config.json in_channels=32, but audio_vae decodes 2 x 32"):
        load_audio_decoders(tmp_path)
