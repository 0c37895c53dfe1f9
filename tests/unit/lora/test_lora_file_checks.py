"""Hostile adapter files are refused naming the file and the key, never a ZeroDivisionError, TypeError or NaN run."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from vidloom.core.errors import CheckpointError
from vidloom.lora.files import METADATA_KEY, read_lora_file

PAIR = {"transformer.x.q.lora_A.weight": torch.ones(4, 6), "transformer.x.q.lora_B.weight": torch.ones(5, 4)}


def _read(tmp_path, tensors, metadata=None, **kwargs):
    path = tmp_path / "bad.safetensors"
    save_file(tensors, str(path), metadata={METADATA_KEY: metadata} if metadata is not None else None)
    return read_lora_file(path, "transformer", **kwargs)


def _config(**options) -> str:
    return json.dumps({f"transformer.{key}": value for key, value in options.items()})


@pytest.mark.parametrize(("tensors", "metadata", "names"), [
    ({"transformer.x.q.lora_A.weight": torch.ones(0, 6), "transformer.x.q.lora_B.weight": torch.ones(5, 0)}, None,
     ("transformer.x.q.lora_A.weight", "rank 0")),
    ({**PAIR, "transformer.x.q.alpha": torch.ones(3, 3)}, None, ("transformer.x.q.alpha", "(3, 3)")),
    ({**PAIR, "transformer.x.q.alpha": torch.tensor(float("nan"))}, None, ("transformer.x.q.alpha", "finite")),
    (PAIR, _config(r=4, lora_alpha="NaN"), ("lora_alpha", "finite number")),
    (PAIR, _config(r=4, lora_alpha=float("nan")), ("lora_alpha", "finite number")),
    (PAIR, json.dumps(["transformer.r", 4]), (METADATA_KEY, "JSON object")),
    (PAIR, _config(rank_pattern={"x.q": "x"}), ("rank_pattern['x.q']", "integer")),
    (PAIR, _config(rank_pattern=["x.q"]), ("rank_pattern", "JSON object")),
    (PAIR, _config(alpha_pattern={"(": 2}), ("alpha_pattern", "regular expression")),
    ({**PAIR, "transformer.x.q.lora_B.weight": torch.full((5, 4), float("nan"))}, None,
     ("transformer.x.q.lora_B.weight", "finite")),
    ({**PAIR, "transformer.x.q.lora_A.weight": torch.ones(4, 6, dtype=torch.int32)}, None,
     ("transformer.x.q.lora_A.weight", "floating-point")),
])
def test_a_bad_file_names_the_file_and_the_key(tmp_path, tensors, metadata, names):
    with pytest.raises(CheckpointError) as caught:
        _read(tmp_path, tensors, metadata)
    assert "bad.safetensors" in str(caught.value)
    for name in names:
        assert name in str(caught.value)


def test_rank_over_the_cap_is_refused_naming_the_setting(tmp_path):
    assert _read(tmp_path, PAIR, max_rank=4).layers["x.q"].down.shape[0] == 4
    with pytest.raises(CheckpointError, match=r"rank 4, over this server's limit max_lora_rank=3"):
        _read(tmp_path, PAIR, max_rank=3)
