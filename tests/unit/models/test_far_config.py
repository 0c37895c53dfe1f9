"""AnyFlow-FAR checkpoint configs: every diffusers setting is read or refused by name, never ignored."""

from __future__ import annotations

import inspect
import json

import pytest
import torch

from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import CheckpointError, InvalidRequest
from vidloom.families.wan_causal.config import CONFIG_KEYS, FarTransformerConfig
from vidloom.families.wan_causal.layout import ChunkLayout

TINY = {"num_attention_heads": 2, "attention_head_dim": 12, "in_channels": 4, "out_channels": 4, "text_dim": 32,
        "freq_dim": 16, "ffn_dim": 32, "num_layers": 2, "rope_max_seq_len": 16, "chunk_partition": [1, 2, 2]}


def test_config_keys_are_the_references_init_arguments():
    diffusers = pytest.importorskip("diffusers")
    params = inspect.signature(diffusers.AnyFlowFARTransformer3DModel.__init__).parameters
    assert CONFIG_KEYS == set(params) - {"self"}


def test_every_setting_reaches_the_config():
    cfg = FarTransformerConfig.from_diffusers({
        **TINY, "_class_name": "AnyFlowFARTransformer3DModel", "_diffusers_version": "0.42.1",
        "patch_size": [1, 2, 2], "compressed_patch_size": [1, 4, 4], "full_chunk_limit": 2, "cross_attn_norm": False,
        "eps": 1e-5, "gate_value": 0.4, "deltatime_type": "t-r", "image_dim": None,
    })
    assert (cfg.full_chunk_limit, cfg.gate_value, cfg.deltatime_type, cfg.chunk_partition) == (2, 0.4, "t-r", (1, 2, 2))
    assert (cfg.wan.eps, cfg.wan.cross_attn_norm, cfg.wan.rope_max_seq_len, cfg.wan.text_dim) == (1e-5, False, 16, 32)
    assert FarTransformerConfig.from_diffusers({**TINY, "out_channels": None}).wan.out_channels == 4


@pytest.mark.parametrize(("key", "value"), [
    ("qk_norm", "rms_norm"),  # a Wan setting, not a FAR one: the FAR blocks always normalise across heads
    ("added_kv_proj_dim", 64),
    ("use_far_mask_v2", True),  # a setting some later release might add
    ("image_dim", 1280),
    ("deltatime_type", "t"),
    ("patch_size", [2, 2, 2]),
    ("compressed_patch_size", [1, 3, 3]),
    ("full_chunk_limit", 0),
    ("chunk_partition", [1, 0, 2]),
])
def test_settings_we_cannot_run_are_refused_by_name(key, value):
    with pytest.raises(CheckpointError, match=key):
        FarTransformerConfig.from_diffusers({**TINY, key: value})


@pytest.mark.parametrize(("field", "partition", "latent_hw"), [
    ("num_frames", (1, 8, 8), (4, 4)), ("height", (1, 2), (34, 4)), ("width", (1, 2), (4, 34)),
])
def test_requests_past_the_rope_range_are_refused(field, partition, latent_hw):
    cfg = FarTransformerConfig.from_diffusers(TINY)  # 16 positions per axis; 2x2 patches
    with pytest.raises(InvalidRequest, match=f"^{field}: .*rope_max_seq_len=16"):
        ChunkLayout.for_chunk(partition, 0, latent_hw, cfg)
    ChunkLayout.for_chunk((1, 7, 8), 2, (32, 32), cfg)  # exactly at the limit is fine


def test_transformer_and_vae_widths_must_agree(tmp_path):
    from vidloom.families.wan_causal.cards import far_card
    from vidloom.families.wan_causal.load import load_instance

    index = {"_class_name": "AnyFlowFARPipeline", **{c: ["diffusers", "X"] for c in
             ("transformer", "vae", "text_encoder", "tokenizer", "scheduler")}}
    (tmp_path / "model_index.json").write_text(json.dumps(index))
    for component, config in (("transformer", TINY), ("vae", {"z_dim": 8}), ("text_encoder", {}), ("tokenizer", {}),
                              ("scheduler", {})):
        (tmp_path / component).mkdir()
        (tmp_path / component / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="in_channels=4: must equal the VAE's z_dim=8"):
        load_instance(far_card("x", str(tmp_path)), tmp_path, torch.device("cpu"), None, DeployConfig())
