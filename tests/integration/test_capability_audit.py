"""Every deploy feature x every kind of checkpoint: honoured where the card declares it, refused by name elsewhere.

For each kind (a column of `vidloom models --capabilities`) a tiny checkpoint is written and its card built:
- the card declares exactly that column (so the printed matrix is what loads see);
- each feature it does not declare, switched on, fails at load with a DeployError naming feature and family, and the
  card gives its reason (a server policy, batching, is not refused at load: the run says it ran alone);
- each feature it declares, switched on, loads (or fails only for this machine, naming CUDA) and leaves evidence
  that it acted: the path changed measurably. A card that claims a feature its load refuses fails here, and
  so does an option a load accepts and ignores.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
import torch

from tests.helpers.capability_audit import (
    COMPONENT_FILES, CUDA_ONLY, ENABLE, IN_THREADS, MASKED_ATTENTION, NOT_OBSERVABLE_HERE, REQUESTS, WRITERS,
    audit_request, scaled_transformer,
)
from tests.helpers.capability_probes import PROBES, parallel_in_threads
from vidloom import registry
from vidloom.cli.capabilities import capability_rows
from vidloom.core.capabilities import FEATURES
from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import DeployError, InvalidRequest
from vidloom.core.request import Task
from vidloom.generator import VideoGenerator
from vidloom.runtime.engine import EngineDriver


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> Callable[[str], Path]:
    written: dict[str, Path] = {}

    def folder(kind: str) -> Path:
        if kind not in written:
            written[kind] = WRITERS[kind](tmp_path_factory.mktemp(kind) / kind)
            COMPONENT_FILES[kind] = scaled_transformer(written[kind])
        return written[kind]

    return folder


def test_every_column_has_a_checkpoint_here():
    assert set(WRITERS) == set(capability_rows()), "a new capability column needs a tiny checkpoint in WRITERS"
    assert set(ENABLE) == set(FEATURES), "a new feature needs a value in ENABLE"


@pytest.mark.parametrize("kind", list(WRITERS))
def test_the_card_declares_its_column_and_its_load_refuses_the_rest(kind, folders):
    path = folders(kind)
    card = registry.resolve_card(path)
    assert card.capabilities == capability_rows()[kind]
    for feature in FEATURES:
        if feature in card.capabilities.supported:
            continue
        assert feature in card.capabilities.why_not, f"{kind} refuses {feature} without a reason"
        if not FEATURES[feature].fields:
            continue  # nothing to refuse at load (tests/integration/test_turned_off_features.py: it runs alone)
        deploy = DeployConfig(**ENABLE[feature](kind))
        with pytest.raises(DeployError) as err:
            registry.load_instance(card, path, torch.device("cpu"), None, deploy)
        # --cfg-parallel needs --devices 2, which a family refusing both names first.
        assert f"({card.family}) does not support " in str(err.value), str(err.value)
        assert f"{feature} ({', '.join(FEATURES[feature].flags)}): " in str(err.value), str(err.value)


# (kind, feature) for every declared feature; the Wan variants only where they differ from "wan".
HONOURED = sorted(
    {(kind, feature) for kind, caps in capability_rows().items() for feature in caps.supported
     if kind in REQUESTS and (kind == "wan" or not kind.startswith("wan") or
                              feature not in capability_rows()["wan"].supported)}
)


@pytest.mark.parametrize(("kind", "feature"), HONOURED, ids=[f"{k}-{f}" for k, f in HONOURED])
def test_a_declared_feature_loads_and_acts(kind, feature, folders, monkeypatch):
    path = folders(kind)
    deploy = DeployConfig(**ENABLE[feature](kind))
    if feature in NOT_OBSERVABLE_HERE:
        VideoGenerator.from_pretrained(path, device="cpu", deploy=deploy)
        return
    if feature in IN_THREADS:
        parallel_in_threads(kind, path, deploy)
        return
    runs: list[int] = []
    real_run = EngineDriver.run
    monkeypatch.setattr(EngineDriver, "run", lambda self, *a, **k: runs.append(1) or real_run(self, *a, **k))
    try:
        gen = VideoGenerator.from_pretrained(path, device="cpu", deploy=deploy)
    except DeployError as exc:
        message = str(exc)
        assert "does not support" not in message, f"{kind} declares {feature} but its load refuses it: {message}"
        if feature in CUDA_ONLY:
            assert "CUDA" in message
            return
        assert feature == "kv_cache_budget_bytes" and "--kv-cache-budget-mb" in message, message
        return  # the budget bounded what the load allocated (the chat KV pool)
    monkeypatch.undo()
    assert feature not in CUDA_ONLY or kind in MASKED_ATTENTION, f"{feature} loaded on CPU"
    PROBES[feature](gen, kind, path, runs)

# The `lora` row (Family.lora; not a deploy feature): a declaring kind takes an adapter on its denoiser's output
# linear, named as its checkpoint names it, and the adapter moves the output; every other kind refuses by name.
@pytest.mark.parametrize("kind", [kind for kind in WRITERS if kind in REQUESTS])
def test_the_lora_row_is_what_loading_an_adapter_does(kind, folders, tmp_path):
    from vidloom.lora.registry import check_family

    gen = VideoGenerator.from_pretrained(folders(kind), device="cpu")
    owner = next(f for f in registry.families() if gen.card.family in f.card_families)
    if owner.lora is None:
        with pytest.raises(InvalidRequest, match=f"not supported for the '{gen.card.family}' family"):
            gen.load_lora("audit", tmp_path / "absent.safetensors")
        return
    check_family(gen.card.family)
    # The last linear the run calls among every target component (Cosmos3's chat backbone runs the prompt prefill
    # first, its generator the steps after it), keyed under the file prefix that component reads.
    calls: list[tuple[str, str]] = []
    hooks = [m.register_forward_hook(lambda *_, at=(component, name): calls.append(at))
             for component, _ in owner.lora.targets if component in gen.engine.instance.components
             for name, m in gen.engine.instance[component].named_modules() if isinstance(m, torch.nn.Linear)]
    request = audit_request(kind)
    output = "audio" if request.task is Task.T2A else "video"  # Stable Audio's result is a waveform
    plain = gen.engine.run(request)[output]
    for hook in hooks:
        hook.remove()
    component, module = calls[-1]
    key = owner.resolve(dict(owner.lora.targets)[component]).to_checkpoint(module)
    gen.load_lora("audit", _adapter_file(gen, component, owner.lora.reads.get(component, component), key, module,
                                         tmp_path))
    adapted = gen.engine.run(dataclasses.replace(request, loras=(("audit", 1.0),)))[output]
    assert np.abs(np.asarray(adapted, np.float32) - np.asarray(plain, np.float32)).max() > 1e-3, "the adapter did nothing"


def _adapter_file(gen: VideoGenerator, component: str, prefix: str, key: str, module: str, folder: Path) -> Path:
    """A rank-2 PEFT file (diffusers' `<prefix>.<module>.lora_A/B.weight` keys) on one linear of `component`."""
    from safetensors.torch import save_file

    linear = gen.engine.instance[component].get_submodule(module)
    g = torch.Generator().manual_seed(0)
    path = folder / "audit.safetensors"
    save_file({f"{prefix}.{key}.lora_A.weight": torch.randn(2, linear.in_features, generator=g),
               f"{prefix}.{key}.lora_B.weight": torch.randn(linear.out_features, 2, generator=g)}, str(path))
    return path
