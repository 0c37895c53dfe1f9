"""SANA-WM's refiner/model_index.json as NVIDIA's convert_sana_wm_to_diffusers.py writes it: only
{"text_max_sequence_length": 1024}, no _class_name and no components (diffusers' SanaWMLTX2Refiner.from_pretrained
takes both from its signature). We read it as that pipeline; the folders the converter does not write are named."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

pytest.importorskip("diffusers")

from vidloom.core.errors import CheckpointError  # noqa: E402
from vidloom.families.sana_wm.refiner_load import load_refiner, open_refiner  # noqa: E402
from tests.helpers.sana_wm_checkpoints import CONFIGS, write_tiny_refiner  # noqa: E402

PUBLISHED = (Path(__file__).resolve().parents[2] / "fixtures" / "published" / "Efficient-Large-Model"
             / "SANA-WM_bidirectional-diffusers" / "refiner")


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> Path:
    """A tiny refiner beside stage 1 whose index is the converter's (with a non-default length to see it read)."""
    root = tmp_path_factory.mktemp("sana-wm")
    refiner = write_tiny_refiner(root, CONFIGS[0])
    (refiner / "model_index.json").write_text(json.dumps({"text_max_sequence_length": 48}, indent=2))
    return root


def test_the_published_converter_output_names_the_folders_it_lacks():
    # Verbatim from the converter: it copies transformer/, connectors/ and text_encoder/ only.
    assert json.loads((PUBLISHED / "model_index.json").read_text()) == {"text_max_sequence_length": 1024}
    with pytest.raises(CheckpointError, match=r"missing component folder\(s\) tokenizer, scheduler"):
        open_refiner(PUBLISHED)


def test_a_classless_index_loads_and_its_text_length_is_read(converted: Path):
    latent_channels = json.loads((converted / "refiner" / "transformer" / "config.json").read_text())["in_channels"]
    parts = load_refiner(converted, torch.device("cpu"), torch.float32, latent_channels)
    assert parts["refiner_text"].max_length == 48


@pytest.mark.parametrize(("index", "message"), [
    ({"_class_name": "LTX2Pipeline", "text_max_sequence_length": 1024}, "says 'LTX2Pipeline', expected"),
    ({"text_max_sequence_length": 1024, "sigmas": [0.9, 0.0]}, r"unsupported config key\(s\) sigmas"),
    ({"text_max_sequence_length": 1024, "vae": ["diffusers", "AutoencoderKLLTX2Video"]}, "stage 1's VAE"),
])
def test_other_indexes_are_refused(converted: Path, tmp_path: Path, index: dict, message: str):
    folder = tmp_path / "refiner"
    shutil.copytree(converted / "refiner", folder)
    (folder / "model_index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=message):
        open_refiner(folder)
