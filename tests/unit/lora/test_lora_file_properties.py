"""Property test (hypothesis) for LoRA file reading: any safetensors metadata, alpha tensor or factor shapes
either load as finite layers or raise CheckpointError naming the file; nothing else escapes (a
ZeroDivisionError, TypeError or re.error would be a 500 from POST /v1/loras)."""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from vidloom.core.errors import CheckpointError, InvalidRequest
from vidloom.lora.files import METADATA_KEY, read_lora_file, split_scale
from vidloom.lora.registry import check_lora_name
from vidloom.serving.config import ServeConfig
from vidloom.serving.errors import APIError
from vidloom.serving.lora_routes import lora_file

PROPERTY = settings(derandomize=True, database=None, deadline=None, max_examples=150)

NUMBERS = st.one_of(st.integers(-3, 8), st.integers(), st.floats(),
                    st.sampled_from([0, 0.0, -0.0, 5e-324, 1e308, 2**53, 10**400, math.nan, math.inf]))
TEXT = st.one_of(st.text(max_size=8), st.sampled_from(["NaN", "x", "(", "q", "x.q", ".*", "(a+)+$", "\ud800", ""]))
JSON_VALUES = st.recursive(st.one_of(st.none(), st.booleans(), NUMBERS, TEXT),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
                           max_leaves=8)
OPTIONS = ("r", "lora_alpha", "use_rslora", "rank_pattern", "alpha_pattern", "use_dora", "lora_bias",
           "fan_in_fan_out", "target_modules")
CONFIG = st.dictionaries(st.one_of(st.sampled_from(OPTIONS).map(lambda o: f"transformer.{o}"), TEXT), JSON_VALUES,
                         max_size=4)
METADATA = st.one_of(
    st.none(), CONFIG.map(lambda c: json.dumps(c, allow_nan=True)), JSON_VALUES.map(json.dumps), TEXT,
    st.sampled_from(["[" * 100_000, "{", json.dumps({"transformer.rank_pattern": {"x.q": "x"}}),
                     json.dumps({"transformer.alpha_pattern": {"(a+)+$": 2}})]),
)
SHAPES = st.one_of(st.tuples(), st.tuples(st.integers(0, 3)), st.tuples(st.integers(0, 3), st.integers(0, 3)),
                   st.tuples(st.integers(0, 2), st.integers(0, 2), st.integers(0, 2)))
DTYPES = st.sampled_from([torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int8, torch.bool])
VALUES = st.sampled_from([0.0, 1.0, -2.5, math.nan, math.inf, 1e30])
TENSOR = st.builds(lambda shape, dtype, value: torch.full(shape, value).to(dtype), SHAPES, DTYPES, VALUES)
FACTORS = st.one_of(
    st.builds(lambda r: {"lora_A.weight": torch.ones(r, 6), "lora_B.weight": torch.ones(5, r)}, st.integers(0, 4)),
    st.dictionaries(st.sampled_from(["lora_A.weight", "lora_B.weight", "alpha", "lora_A", "weight"]), TENSOR,
                    max_size=3),
)


@PROPERTY
@given(layers=st.dictionaries(st.sampled_from(["x.q", "x.k", "q"]), FACTORS, min_size=1, max_size=2),
       alpha=st.one_of(st.none(), TENSOR), metadata=METADATA, prefix=st.sampled_from(["transformer.", "unet.", ""]),
       max_rank=st.sampled_from([None, 2, 8]))
def test_any_file_loads_or_names_the_file(layers, alpha, metadata, prefix, max_rank):
    tensors = {f"{prefix}{module}.{suffix}": tensor for module, parts in layers.items()
               for suffix, tensor in parts.items()}
    if alpha is not None:
        tensors[f"{prefix}{next(iter(layers))}.alpha"] = alpha
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "fuzzed.safetensors"
        try:
            save_file(tensors, str(path), metadata=None if metadata is None else {METADATA_KEY: metadata})
        except (ValueError, UnicodeEncodeError):  # safetensors cannot write it (a surrogate): nothing to read
            return
        try:
            adapter = read_lora_file(path, "transformer", max_rank=max_rank)
        except CheckpointError as exc:
            assert "fuzzed.safetensors" in str(exc), exc
            return
    for layer in adapter.layers.values():  # accepted: a finite scaling over finite factors
        assert math.isfinite(layer.scaling) and bool(torch.isfinite(layer.down).all() & torch.isfinite(layer.up).all())


PATH_TEXT = st.one_of(TEXT, st.sampled_from(["a.safetensors:0.5", "a:nan", "a:inf", "a:1e400", "a:", ":", "a:b:2",
                                             "../x.safetensors", "/etc/passwd", "x\x00y", "a" * 5000, "link",
                                             "a.safetensors", "./a.safetensors", "nope/../a.safetensors"]))


@PROPERTY
@given(text=PATH_TEXT)
def test_any_lora_flag_value_splits_or_names_the_field(text):
    """--lora NAME=PATH[:SCALE]: a path and a finite scale, or InvalidRequest naming the flag."""
    try:
        path, scale = split_scale(text, "--lora")
    except InvalidRequest as exc:
        assert exc.field == "--lora"
        return
    assert math.isfinite(scale) and isinstance(path, Path)


@PROPERTY
@given(name=st.one_of(TEXT, JSON_VALUES))
def test_any_adapter_name_is_checked_or_named(name):
    try:
        assert check_lora_name(name) == name
    except InvalidRequest as exc:
        assert exc.field == "name"


def test_any_admin_path_is_a_file_inside_the_folders_or_one_answer(tmp_path):
    """POST /v1/loras' path: a file inside --lora-dir, or the same 400 naming `path` whatever lies outside."""
    folder, outside = tmp_path / "loras", tmp_path / "secret.safetensors"
    folder.mkdir()
    (folder / "a.safetensors").write_bytes(b"x")
    outside.write_bytes(b"x")
    (folder / "link").symlink_to(outside)
    config = ServeConfig(data_dir=tmp_path / "data", lora_dirs=(folder,))

    @PROPERTY
    @given(text=PATH_TEXT)
    def run(text: str) -> None:
        try:
            found = lora_file(text, config)
        except APIError as exc:
            assert exc.status == 400 and exc.param == "path" and str(tmp_path) not in exc.message, exc.message
            return
        assert found == (folder / "a.safetensors").resolve()

    run()
