"""DiffusersDir: a checkpoint missing any folder its card declares is refused up front, naming every one."""

import json

import pytest

from vidloom.core.errors import CheckpointError
from vidloom.loading.diffusers_dir import DiffusersDir
from vidloom.families.wan.demo import demo_card


def test_missing_component_folders_are_all_named(tmp_path):
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "WanPipeline"}))
    (tmp_path / "transformer").mkdir()
    (tmp_path / "vae").mkdir()
    with pytest.raises(CheckpointError, match="missing component folder\\(s\\) text_encoder, tokenizer, scheduler"):
        DiffusersDir.open(tmp_path).require(demo_card().components)


def test_complete_directory_passes(tmp_path):
    (tmp_path / "model_index.json").write_text("{}")
    for name in demo_card().components:
        (tmp_path / name).mkdir()
    DiffusersDir.open(tmp_path).require(demo_card().components)


def _index(tmp_path, **index) -> DiffusersDir:
    (tmp_path / "model_index.json").write_text(json.dumps(index))
    return DiffusersDir.open(tmp_path)


def test_check_index_names_an_unknown_key_and_the_file(tmp_path):
    ckpt = _index(tmp_path, _class_name="WanPipeline", _diffusers_version="0.42.0", vae=["diffusers", "X"],
                  flow_guidance=True)
    with pytest.raises(CheckpointError, match=rf"{tmp_path}/model_index.json: unsupported config key\(s\) "
                                              r"flow_guidance; this runtime reads vae"):
        ckpt.check_index(["vae"])
    ckpt.check_index(["vae"], ["flow_guidance"])  # a setting the loader reads is fine


def test_check_index_refuses_an_unsupported_component_only_when_present(tmp_path):
    absent = _index(tmp_path, duration_head=[None, None])  # diffusers' way of saving an absent optional one
    absent.check_index([], unsupported={"duration_head": "not implemented"})
    assert not absent.has("duration_head")
    present = _index(tmp_path, duration_head=["ltx2", "LTX2DurationHead"])
    assert present.has("duration_head")
    with pytest.raises(CheckpointError, match="component 'duration_head' is not supported \\(not implemented\\)"):
        present.check_index([], unsupported={"duration_head": "not implemented"})


def test_parse_component_names_the_file(tmp_path):
    ckpt = _index(tmp_path, vae=["diffusers", "AutoencoderKLWan"])
    (tmp_path / "vae").mkdir()
    (tmp_path / "vae" / "config.json").write_text(json.dumps({"z_dim": 4}))

    def parse(cfg: dict) -> int:
        raise ValueError(f"z_dim={cfg['z_dim']} is odd")

    with pytest.raises(CheckpointError, match=rf"{tmp_path}/vae/config.json: z_dim=4 is odd"):
        ckpt.parse_component("vae", parse)
