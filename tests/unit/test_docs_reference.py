"""The reference pages of the docs site are what docs/gen_reference.py writes from the code, so they cannot drift."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _generator():
    spec = importlib.util.spec_from_file_location("gen_reference", ROOT / "docs" / "gen_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def pages() -> dict[Path, str]:
    return _generator().generate()


def test_committed_reference_pages_equal_the_generated_ones(pages):
    stale = [str(path.relative_to(ROOT)) for path, text in pages.items()
             if not path.exists() or path.read_text() != text]
    assert not stale, f"stale reference pages: {stale}; run `python docs/gen_reference.py` and commit them"


def test_every_cli_flag_and_card_key_is_listed(pages):
    from vidloom.cli import build_parser
    from vidloom.core.deploy import DeployConfig
    from vidloom.serving.config import ServeConfig
    import dataclasses

    cli = pages[ROOT / "docs" / "reference" / "cli.md"]
    generator = _generator()
    for command, parser in generator._subcommands(build_parser(), "vidloom"):
        assert f"## `{command}`" in cli
        for action in parser._actions:
            for option in action.option_strings:
                if option not in ("-h", "--help"):
                    assert f"`{option}`" in cli, f"{command} {option} missing from the CLI reference"
    card = pages[ROOT / "docs" / "reference" / "deploy-card.md"]
    for cls in (ServeConfig, DeployConfig):
        for field in dataclasses.fields(cls):
            assert f"| `{field.name}` |" in card, f"card key {field.name} missing"


def test_field_descriptions_come_from_the_source():
    from vidloom.core.deploy import DeployConfig
    from vidloom.serving.config import ServeConfig
    from vidloom.serving.protocol import VideoCreateBody

    docs = _generator().field_docs
    assert docs(DeployConfig)["fp8_weights"].startswith("Store the denoiser's block linears")  # attribute docstring
    assert docs(ServeConfig)["slots"] == "requests resident on the device at once"  # trailing comment
    assert docs(ServeConfig)["store"].startswith("Job table: None = SQLite")  # the comment block above
    assert "the first frame" in docs(VideoCreateBody)["input_reference"]
    assert docs(VideoCreateBody)["guidance_scale"] == ""  # inherited field without a comment: no invented text
