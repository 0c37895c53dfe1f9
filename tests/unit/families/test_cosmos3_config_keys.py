"""Every key Cosmos3's reference classes register is read by our loaders or refused naming it.

Enumerates Cosmos3OmniPipeline.__init__ (model_index.json) and the components' register_to_config
parameters (transformer, VAE, scheduler, audio tokenizer): a key a newer diffusers adds fails here
until a loader reads or refuses it. Also the published values the tiny fixtures carry.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Callable

import pytest

diffusers = pytest.importorskip("diffusers")

from tests.helpers.config_keys import reference_keys, stale_keys, unhandled_keys  # noqa: E402
from tests.helpers.cosmos3_checkpoints import COSMOS3_NANO_SCHEDULER  # noqa: E402
from vidloom.core.errors import CheckpointError  # noqa: E402
from vidloom.diffusion.sampler import SamplerConfig, known_scheduler_keys  # noqa: E402
from vidloom.families.cosmos3.audio import SOUND_TOKENIZER_KEYS, SoundDecoderConfig  # noqa: E402
from vidloom.families.cosmos3.config import TRANSFORMER_KEYS, TRANSFORMER_POLICY  # noqa: E402
from vidloom.models.wan.vae import WAN_VAE_POLICY  # noqa: E402
from vidloom.families.cosmos3.gen_config import Cosmos3GenConfig  # noqa: E402
from vidloom.families.cosmos3.gen_load import VAE_KEYS, read_vae_config  # noqa: E402
from vidloom.families.cosmos3.pipeline_config import INDEX_KEYS, SAFETY_NOTE, Cosmos3PipelineConfig  # noqa: E402

PROBE = "__probe__"  # a value no reader would take for a real setting
INDEX = {"_class_name": "Cosmos3OmniPipeline", "transformer": ["diffusers", "Cosmos3OmniTransformer"],
         "text_tokenizer": ["transformers", "Qwen2Tokenizer"], "vae": ["diffusers", "AutoencoderKLWan"],
         "scheduler": ["diffusers", "UniPCMultistepScheduler"], "sound_tokenizer": [None, None],
         "safety_checker": [None, None], "enable_safety_checker": False, "default_use_system_prompt": True,
         "use_native_flow_schedule": False}
TRANSFORMER = {"hidden_size": 32, "head_dim": 8, "num_attention_heads": 4, "num_key_value_heads": 2,
               "rope_axes_dim": [2, 1, 1], "latent_channel": 4, "patch_latent_dim": 16}
VAE = {"base_dim": 8, "z_dim": 4, "dim_mult": [1, 2, 2, 2], "num_res_blocks": 1, "latents_mean": [0.0] * 4,
       "latents_std": [1.0] * 4, "is_residual": True, "patch_size": 2, "in_channels": 12, "out_channels": 12}
ERRORS = (CheckpointError, ValueError)
# Keys accepted (harmless) or refused by value that today's classes need not have: older releases had them, or a
# converter writes them (each with its reason in the policy).
HISTORICAL = frozenset({*TRANSFORMER_POLICY.harmless, *WAN_VAE_POLICY.refused, *WAN_VAE_POLICY.harmless})

# reference class -> (the keys our reader declares, load a config with one key set to PROBE)
COMPONENTS: dict[str, tuple[type, frozenset[str], Callable[[str], Any]]] = {
    "pipeline": (diffusers.Cosmos3OmniPipeline, INDEX_KEYS,
                 lambda key: Cosmos3PipelineConfig.from_index({**INDEX, key: PROBE}, "model_index.json")),
    "transformer": (diffusers.Cosmos3OmniTransformer, TRANSFORMER_KEYS,
                    lambda key: Cosmos3GenConfig.from_transformer_config({**TRANSFORMER, key: PROBE})),
    "vae": (diffusers.AutoencoderKLWan, VAE_KEYS - {"_class_name"},
            lambda key: read_vae_config({**VAE, key: PROBE}, "vae/config.json")),
    "scheduler": (diffusers.UniPCMultistepScheduler, known_scheduler_keys("UniPCMultistepScheduler"),
                  lambda key: SamplerConfig.from_diffusers({**COSMOS3_NANO_SCHEDULER, key: PROBE})),
    "sound_tokenizer": (diffusers.Cosmos3AVAEAudioTokenizer, SOUND_TOKENIZER_KEYS,
                        lambda key: SoundDecoderConfig.from_diffusers({key: PROBE})),
}


@pytest.mark.parametrize("component", list(COMPONENTS))
def test_every_reference_key_is_read_or_refused(component: str) -> None:
    cls, read, load_with = COMPONENTS[component]
    assert not unhandled_keys(cls, read, load_with, ERRORS), f"{component}: read these keys or refuse them by name"
    assert not stale_keys(cls, read - HISTORICAL), f"{component}: our reader names keys {cls.__name__} does not have"


@pytest.mark.parametrize("component", list(COMPONENTS))
def test_an_unknown_key_is_refused_by_name(component: str) -> None:
    _, _, load_with = COMPONENTS[component]
    with pytest.raises(ERRORS, match="some_new_option"):
        load_with("some_new_option")


def test_the_helper_lists_a_key_that_is_silently_accepted() -> None:
    class Newer:
        def __init__(self, transformer: Any, vae: Any, *args: Any, new_setting: bool = False, **kwargs: Any) -> None:
            ...

    assert reference_keys(Newer) == {"transformer", "vae", "new_setting"}
    assert unhandled_keys(Newer, INDEX_KEYS - {"vae"}, lambda key: None) == ["new_setting", "vae"]
    assert unhandled_keys(Newer, INDEX_KEYS, lambda key: None) == ["new_setting"]
    # Refused, but without naming the key: still unhandled (the error must say which key).
    assert unhandled_keys(Newer, INDEX_KEYS, lambda key: 1 / 0, (ZeroDivisionError,)) == ["new_setting"]


def test_pipeline_settings_are_read() -> None:
    config = Cosmos3PipelineConfig.from_index(
        {**INDEX, "default_use_system_prompt": False, "use_native_flow_schedule": True}, "x")
    assert config == Cosmos3PipelineConfig(safety_checker=False, use_system_prompt=False, native_flow_schedule=True)
    absent = {k: v for k, v in INDEX.items() if k not in ("enable_safety_checker", "default_use_system_prompt",
                                                          "use_native_flow_schedule")}
    assert Cosmos3PipelineConfig.from_index(absent, "x") == Cosmos3PipelineConfig()  # the pipeline's defaults


@pytest.mark.parametrize(("patch", "named"), [
    ({"default_use_system_prompt": "no"}, "default_use_system_prompt"),
    ({"use_native_flow_schedule": 1}, "use_native_flow_schedule"),
    ({"vae": ["diffusers", "AutoencoderKLLTX2Video"]}, "vae"),
    ({"scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"]}, "scheduler"),
    ({"safety_checker": ["my_guard", "Checker"]}, "safety_checker"),
    ({"text_tokenizer": ["diffusers", "Foo"]}, "text_tokenizer"),
    ({"is_distilled": True}, "is_distilled"),
])
def test_bad_pipeline_settings_are_refused(patch: dict[str, Any], named: str) -> None:
    with pytest.raises(CheckpointError, match=named):
        Cosmos3PipelineConfig.from_index({**INDEX, **patch}, "model_index.json")


@pytest.mark.parametrize(("patch", "named"), [
    ({"dec_type": "hifigan"}, "dec_type"), ({"latent_std": 2.0}, "latent_std"),
    ({"bottleneck": {"type": "rvq"}}, "bottleneck"),
])
def test_unsupported_audio_tokenizer_values_are_refused(patch: dict[str, Any], named: str) -> None:
    with pytest.raises(CheckpointError, match=named):
        SoundDecoderConfig.from_diffusers(patch)


def test_a_guardrail_checkpoint_loads_and_says_it_runs_unscreened(cosmos3_dir: Path, tmp_path: Path) -> None:
    from vidloom.generator import VideoGenerator
    from vidloom.families.cosmos3.cards import card_from_checkpoint

    folder = tmp_path / "guarded"
    shutil.copytree(cosmos3_dir, folder)
    index = json.loads((folder / "model_index.json").read_text())
    index.update(enable_safety_checker=True, safety_checker=["cosmos_guardrail", "CosmosSafetyChecker"])
    (folder / "model_index.json").write_text(json.dumps(index))
    assert SAFETY_NOTE in card_from_checkpoint(folder).notes
    assert SAFETY_NOTE not in card_from_checkpoint(cosmos3_dir).notes
    index["future_setting"] = 1
    (folder / "model_index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="future_setting"):
        VideoGenerator.from_pretrained(folder, device="cpu")
