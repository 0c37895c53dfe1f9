"""KeyPolicy: unknown keys refused by name, refused values named with their reason, harmless keys accepted and
recorded on the load; and the published files the old policy turned away (from the published-config corpus,
tests/fixtures/published/<org>/<repo>) parsed by our readers."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from vidloom.core.errors import CheckpointError
from vidloom.loading.key_policy import DOCS, KeyPolicy, Refusal, recording_accepted_keys

PUBLISHED = Path(__file__).resolve().parents[2] / "fixtures" / "published"
POLICY = KeyPolicy(frozenset({"width"}), harmless={"upcast": "a float16 hint that our dtype setting replaces"},
                   refused={"clip": Refusal((True,), "false leaves outputs unclamped; we always clamp")})


def _published(path: str) -> dict:
    return json.loads((PUBLISHED / path).read_text())


def test_an_unknown_key_is_refused_naming_it_and_the_page_listing_every_key():
    with pytest.raises(CheckpointError, match=rf"where: unsupported config key\(s\) future; this runtime reads width "
                                              rf"\(every key it knows: {DOCS}\)"):
        POLICY.check({"width": 1, "future": 2, "_class_name": "X", "_diffusers_version": "0.1"}, "where")


def test_a_refused_value_names_key_value_and_why_and_the_implemented_value_passes():
    with pytest.raises(CheckpointError, match=r"where: clip=False is not supported: false leaves outputs unclamped; "
                                              r"we always clamp \(this runtime runs clip=True\)"):
        POLICY.check({"clip": False}, "where")
    with pytest.raises(CheckpointError, match="clip=1 is not supported"):  # JSON 1 is not true
        POLICY.check({"clip": 1}, "where")
    assert POLICY.check({"clip": True, "width": 3}, "where") == ()


def test_harmless_keys_are_returned_and_recorded_once_per_file_during_a_load():
    assert POLICY.check({"upcast": True}, "outside") == ("upcast",)  # no load running: nothing to record
    with recording_accepted_keys() as accepted:
        POLICY.check({"upcast": True}, "vae/config.json")
        POLICY.check({"upcast": True}, "vae/config.json")  # a card builder and the loader read one file
        POLICY.check({"width": 1}, "transformer/config.json")
    assert [str(a) for a in accepted] == [
        "upcast=True in vae/config.json: a float16 hint that our dtype setting replaces"]


def test_quiet_harmless_keys_are_accepted_but_not_recorded():
    """What today's class writes into every file (a UniPC config's DDPM keys) would make every load's notes
    noise; quiet keys pass like any harmless key and leave the record to keys that set a file apart."""
    policy = KeyPolicy(frozenset(), harmless={"upcast": "an old fp16 hint", "beta_start": "the DDPM path only"},
                       quiet=frozenset({"beta_start"}))
    with recording_accepted_keys() as accepted:
        assert policy.check({"upcast": True, "beta_start": 0.1}, "cfg") == ("upcast", "beta_start")
    assert [a.key for a in accepted] == ["upcast"]
    with pytest.raises(AssertionError, match="quiet keys must be harmless"):
        KeyPolicy(frozenset({"a"}), quiet=frozenset({"a"}))


def test_a_key_in_two_classes_is_a_mistake_in_the_table():
    with pytest.raises(AssertionError, match="two classes"):
        KeyPolicy(frozenset({"a"}), harmless={"a": "a reason long enough to say why"})


def test_flux2_klein_vae_with_force_upcast_parses():
    from vidloom.families.flux2.vae import Flux2VAEConfig

    with recording_accepted_keys() as accepted:
        config = Flux2VAEConfig.from_diffusers(_published("black-forest-labs/FLUX.2-klein-4B/vae/config.json"))
    assert config.latent_channels == 32
    assert [a.key for a in accepted] == ["sample_size", "batch_norm_momentum", "force_upcast"]  # the table's order


def test_cosmos3_edge_transformer_and_index_parse():
    from vidloom.families.cosmos3.config import Cosmos3TextConfig
    from vidloom.families.cosmos3.gen_config import Cosmos3GenConfig
    from vidloom.families.cosmos3.pipeline_config import Cosmos3PipelineConfig

    raw = _published("nvidia/Cosmos3-Edge/transformer/config.json")
    with recording_accepted_keys() as accepted:
        text = Cosmos3TextConfig.from_transformer_config(raw)
        Cosmos3GenConfig.from_transformer_config(raw)
    assert (text.hidden_act, text.qk_norm, text.rope_axes_dim) == ("relu2", False, (24, 20, 20))
    assert {a.key for a in accepted} == {"attention_dropout", "backbone_type", "temporal_compression_factor"}
    pipeline = Cosmos3PipelineConfig.from_index(_published("nvidia/Cosmos3-Edge/model_index.json"), "model_index.json")
    assert (pipeline.use_system_prompt, pipeline.native_flow_schedule, pipeline.safety_checker) == (False, True, False)


@pytest.mark.parametrize("value", [True, False])
def test_wan22_vae_clip_output_true_is_what_we_run_and_false_is_refused(value):
    from vidloom.models.wan.vae import WanVAEConfig

    raw = {**_published("Wan-AI/Wan2.2-TI2V-5B-Diffusers/vae/config.json"), "clip_output": value}
    if value:
        assert WanVAEConfig.from_diffusers(raw).z_dim == 48
    else:
        with pytest.raises(CheckpointError, match=r"clip_output=False is not supported: false leaves decoded frames"):
            WanVAEConfig.from_diffusers(raw)


def _dmd_folder(tmp_path: Path, **index: object) -> Path:
    from tests.helpers.wan_checkpoints import TINY_A, write_tiny_wan

    folder = write_tiny_wan(tmp_path / "src", TINY_A)
    dst = tmp_path / "FastWan-tiny"
    shutil.copytree(folder, dst)
    published = _published("FastVideo/FastWan2.1-T2V-1.3B-Diffusers/model_index.json")
    path = dst / "model_index.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "_class_name": published["_class_name"], **index}))
    return dst


def test_a_wan_dmd_pipeline_folder_gets_the_fastwan_recipe_and_loads_with_the_registered_card(tmp_path):
    from vidloom import registry
    from vidloom.core.deploy import DeployConfig
    import torch

    folder = _dmd_folder(tmp_path)
    card = registry.resolve_card(folder)
    registered = registry.resolve_card("fastwan2.1-t2v-1.3b")
    assert (card.recipe, card.sampling_defaults, card.loops) == (
        registered.recipe, registered.sampling_defaults, registered.loops)
    assert card.source == str(folder) and card.recipe.sampler == "dmd"
    instance = registry.load_instance(registered, folder, torch.device("cpu"), torch.float32, DeployConfig())
    assert "transformer" in instance.components


def test_a_wan_dmd_pipeline_folder_that_expands_timesteps_is_fastwan22(tmp_path):
    from vidloom import registry

    card = registry.resolve_card(_dmd_folder(tmp_path, expand_timesteps=True))
    assert (card.family, card.recipe) == ("wan2.2", registry.resolve_card("fastwan2.2-ti2v-5b").recipe)


def test_accepted_keys_reach_the_instance_the_generator_and_the_cli_notes(flux2_distilled_dir, tmp_path):
    from vidloom.generator import VideoGenerator

    folder = tmp_path / "klein"
    shutil.copytree(flux2_distilled_dir, folder)
    vae = folder / "vae" / "config.json"
    vae.write_text(json.dumps({**json.loads(vae.read_text()), "force_upcast": True}))
    generator = VideoGenerator.from_pretrained(folder, device="cpu")
    force_upcast = [line for line in generator.accepted_config_keys if line.startswith("force_upcast=")]
    assert force_upcast == [f"force_upcast=True in {vae}: a float16 precision hint for diffusers' pipelines; "
                            "the card's VAE dtype sets ours"]
    assert generator.notes[-1].startswith("config key(s) accepted without effect: ")
    assert "force_upcast" in generator.notes[-1]


def test_a_fastvideo_native_folder_is_named_as_such(tmp_path):
    from vidloom.loading.diffusers_dir import DiffusersDir

    # FastVideo's stable_audio_to_diffusers.py writes FastVideo's own component classes under a diffusers name.
    index = {"_class_name": "StableAudioPipeline", "_fastvideo_converted_from": "stabilityai/stable-audio-open-1.0",
             "transformer": ["fastvideo.models.dits.stable_audio", "StableAudioDiT"],
             "scheduler": ["diffusers", "CosineDPMSolverMultistepScheduler"]}
    (tmp_path / "model_index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=r"a FastVideo-native layout \(transformer: fastvideo.models.dits."
                                              r"stable_audio.StableAudioDiT\), not a diffusers folder"):
        DiffusersDir.open(tmp_path).check_index(("transformer", "scheduler"))


def _policies() -> list[tuple[str, KeyPolicy]]:
    from vidloom.loading.key_policies import KEY_POLICIES, key_policy

    return [(f"{cls} ({where})", key_policy(target)) for (cls, where), target in KEY_POLICIES.items()]


@pytest.mark.parametrize(("name", "policy"), _policies(), ids=[name for name, _ in _policies()])
def test_every_refusal_names_key_value_and_reason_and_every_harmless_key_is_reported(name, policy):
    for key, refusal in policy.refused.items():
        message = rf"where: {key}='__other__' is not supported: {re.escape(refusal.why)}"
        with pytest.raises(CheckpointError, match=message):
            policy.check({key: "__other__"}, "where")
        assert policy.check({key: refusal.accepts[0]}, "where") == ()
    for key in policy.harmless:
        assert policy.check({key: 1}, "where") == (key,)


# Keys a class had in diffusers' history but not in the installed release, or that an official converter writes:
# found by walking every commit of each class's file in huggingface/diffusers (main of 2026-08-23) and reading
# its __init__ arguments; every other historical key of the classes we read is still an argument today (and so
# checked by the test_config_keys_* files against the installed classes).
HISTORICAL = {
    "vidloom.models.wan.vae:WAN_VAE_POLICY": {"clip_output"},  # #12004..#12041, 2025-07-28..31
    "vidloom.families.flux2.vae:FLUX2_VAE_POLICY": {"force_upcast"},  # 0.36.0 (#12711) .. after 2026-08
    # NVIDIA's convert_model_to_diffusers writes these into the Cosmos3-Edge transformer/config.json.
    "vidloom.families.cosmos3.config:TRANSFORMER_POLICY": {"backbone_type", "temporal_compression_factor"},
}


@pytest.mark.parametrize("target", sorted(HISTORICAL))
def test_historical_and_converter_keys_are_classified(target):
    from vidloom.loading.key_policies import key_policy

    assert HISTORICAL[target] <= key_policy(target).known
