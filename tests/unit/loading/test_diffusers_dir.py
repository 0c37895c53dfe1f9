"""DiffusersDir: a checkpoint missing any folder its card declares is refused up front, naming every one."""

import json

import pytest

from vidloom.core.errors import CheckpointError
from vidloom.loading.diffusers_dir import DiffusersDir
from vidloom.recipes.wan.demo import demo_card


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
