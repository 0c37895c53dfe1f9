"""Card capabilities: every deploy field has a feature, a card refuses what it does not declare, by name."""

from __future__ import annotations

import dataclasses

import pytest

from vidloom.core.capabilities import FEATURES, Capabilities, enabled_features
from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import DeployError, InvalidCard
from vidloom.core.parallel import ParallelPlan


def test_every_deploy_field_belongs_to_exactly_one_feature():
    owners: dict[str, list[str]] = {}
    for name, feature in FEATURES.items():
        for field in feature.fields:
            owners.setdefault(field, []).append(name)
    # The parallel plan's degrees are features of their own ("parallel.sp", "parallel.cfg").
    fields = [f.name for f in dataclasses.fields(DeployConfig) if f.name != "parallel"]
    fields += [f"parallel.{f.name}" for f in dataclasses.fields(ParallelPlan)]
    assert sorted(owners) == sorted(fields), "a DeployConfig field without a feature would reach every family"
    assert all(len(names) == 1 for names in owners.values()), owners


def test_the_plain_deployment_turns_on_nothing():
    assert enabled_features(DeployConfig()) == []
    assert enabled_features(DeployConfig(vae_tile=64, vae_tile_stride=32)) == ["vae_tile"]
    assert enabled_features(DeployConfig(devices=2, parallel=ParallelPlan(sp=2))) == ["devices"]
    assert enabled_features(DeployConfig(devices=2, parallel=ParallelPlan(cfg=2))) == ["devices", "cfg_parallel"]


def test_an_undeclared_feature_is_refused_naming_feature_flags_model_family_and_reason():
    caps = Capabilities(frozenset({"compile"}), {"step_cache": "no block list"})
    caps.refuse_unsupported(DeployConfig(compile=True, compile_backend="eager"), "m", "fam")  # declared: fine
    with pytest.raises(DeployError) as err:
        caps.refuse_unsupported(DeployConfig(step_cache="fbcache", prompt_cache_size=2), "m", "fam")
    message = str(err.value)
    assert "m (fam) does not support" in message
    assert "step_cache (--step-cache, --step-cache-threshold, --step-cache-fn, " in message
    assert "--step-cache-mask): no block list" in message
    assert "prompt_cache_size (--prompt-cache): not wired for this family" in message


def test_a_card_that_declares_nothing_supports_nothing():
    with pytest.raises(DeployError, match="warmup_shapes"):
        Capabilities(frozenset()).refuse_unsupported(DeployConfig(warmup_shapes=((16, 16, 1),)), "m", "fam")


def test_without_moves_a_feature_to_the_refused_with_its_reason():
    caps = Capabilities(frozenset({"compile", "cfg_mode"})).without({"cfg_mode": "no CFG"})
    assert caps.supported == {"compile"} and caps.why_not["cfg_mode"] == "no CFG"


def test_plus_moves_refused_features_back_to_the_supported_and_keeps_the_rest():
    base = Capabilities(frozenset({"compile"}), {"cfg_mode": "no CFG", "cuda_graphs": "no graphs"}, "no adapters")
    caps = base.plus("cuda_graphs")
    assert caps.supported == {"compile", "cuda_graphs"} and dict(caps.why_not) == {"cfg_mode": "no CFG"}
    assert caps.lora_why_not == "no adapters" and base.plus("compile") == base


@pytest.mark.parametrize(("supported", "why_not", "message"), [
    ({"turbo"}, {}, "unknown features \\['turbo'\\]"),
    ({"compile"}, {"compile": "x"}, "both support and explain"),
])
def test_bad_declarations_are_invalid_cards(supported, why_not, message):
    with pytest.raises(InvalidCard, match=message):
        Capabilities(frozenset(supported), why_not)


@pytest.mark.parametrize(("deploy", "message"), [
    (dict(compile_backend="aot_eager"), "compile_backend='aot_eager' \\(--compile-backend\\).*needs compile"),
    (dict(step_cache_threshold=0.2), "step_cache_threshold \\(--step-cache-threshold\\) needs a step cache"),
])
def test_an_option_that_only_tunes_another_is_refused_alone(deploy, message):
    with pytest.raises(DeployError, match=message):
        DeployConfig(**deploy)
