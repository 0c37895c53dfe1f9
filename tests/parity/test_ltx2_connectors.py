"""LTX-2 text connectors: ours vs diffusers' LTX2TextConnectors on the same weights and padded prompts."""

from __future__ import annotations

import json

import pytest
import torch

from tests.helpers.ltx2_checkpoints import CONFIGS, TinyLTX2
from vidloom.core.errors import CheckpointError
from vidloom.loading.safetensors_io import load_weights
from vidloom.models.ltx2.connectors import LTX2_CONNECTORS_NAME_MAP, LTX2ConnectorsConfig, LTX2TextConnectors

TOLERANCE = 1e-5  # fp32, same op order; observed ~1e-7


def _pair(spec: TinyLTX2, tmp_path, **overrides):
    from diffusers.pipelines.ltx2 import LTX2TextConnectors as Reference

    torch.manual_seed(1)
    ref = Reference(caption_channels=spec.text_hidden, text_proj_in_factor=spec.text_layers + 1,
                    **{**spec.connectors, **overrides}).eval()
    ref.save_pretrained(str(tmp_path))
    config = LTX2ConnectorsConfig.from_diffusers(json.loads((tmp_path / "config.json").read_text()))
    ours = LTX2TextConnectors(config).eval()
    load_weights(ours, tmp_path, LTX2_CONNECTORS_NAME_MAP)
    return ref, ours


@pytest.mark.parametrize("spec", CONFIGS, ids=lambda s: s.name)
@pytest.mark.parametrize("per_modality", [False, True], ids=["ltx2.0", "ltx2.3-projections"])
def test_connectors_match_diffusers(spec, per_modality, tmp_path):
    extra = dict(per_modality_projections=True, video_hidden_dim=spec.text_hidden,
                 audio_hidden_dim=spec.text_hidden) if per_modality else {}
    ref, ours = _pair(spec, tmp_path, **extra)
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 16, spec.text_hidden * (spec.text_layers + 1), generator=g) * 3
    mask = torch.ones(2, 16, dtype=torch.int64)
    mask[0, :11] = 0  # left padding, as Gemma's tokenizer pads here
    mask[1, :4] = 0
    with torch.no_grad():
        expected = ref(hidden, mask, padding_side="left")
        got = ours(hidden, mask, "left")
    for e, o in zip(expected, got):
        assert e.shape == o.shape
        assert (e.float() - o.float()).abs().max() < TOLERANCE
    assert expected[0].abs().max() > 0.1


def test_unknown_connectors_key_is_named():
    with pytest.raises(CheckpointError, match="unsupported config key\\(s\\) mystery"):
        LTX2ConnectorsConfig.from_diffusers({"mystery": 1})
