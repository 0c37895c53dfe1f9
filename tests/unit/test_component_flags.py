"""The component-override option in its three spellings: from_pretrained(components=), --component NAME=FILE,
and `components:` in a deployment card; each checked before anything loads."""

from __future__ import annotations

from pathlib import Path

import pytest

from vidloom.cli import build_parser
from vidloom.core.deploy import DeployConfig
from vidloom.core.errors import DeployError
from vidloom.cli.deploy_args import deploy_config
from vidloom.serving.deploy_card import dump_card, load_card, build
from vidloom.serving.config import ServeConfig
from vidloom.serving.serve_flags import effective_config, typed_flags


def _serve(argv: list[str]) -> ServeConfig:
    parser = build_parser()
    return effective_config(parser.parse_args(argv), typed_flags(parser, argv))


def test_the_flag_repeats_and_gives_absolute_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = build_parser().parse_args(["generate", "--prompt", "x", "--component", "transformer=t.safetensors",
                                      "--component", "vae=~/v.gguf"])
    assert deploy_config(args).components == (("transformer", str(tmp_path / "t.safetensors")),
                                              ("vae", str(Path("~/v.gguf").expanduser())))


def test_a_flag_without_a_name_is_refused(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["generate", "--prompt", "x", "--component", "t.safetensors"])
    assert "expected NAME=FILE" in capsys.readouterr().err


def test_the_card_writes_a_mapping_and_flags_add_to_it(tmp_path, monkeypatch):
    monkeypatch.delenv("VIDLOOM_API_KEY", raising=False)
    card = tmp_path / "deploy.yaml"
    card.write_text("deploy:\n  components:\n    transformer: /models/wan.safetensors\n")
    assert _serve(["serve", "--config", str(card)]).deploy.components == (("transformer", "/models/wan.safetensors"),)
    both = _serve(["serve", "--config", str(card), "--component", "vae=/models/vae.safetensors"])
    assert dict(both.deploy.components) == {"transformer": "/models/wan.safetensors", "vae": "/models/vae.safetensors"}
    printed = tmp_path / "printed.yaml"
    printed.write_text(dump_card(both))
    assert "  components:\n    transformer: /models/wan.safetensors\n" in printed.read_text()
    assert build(ServeConfig, load_card(printed)) == both


@pytest.mark.parametrize("components,message", [
    ((("transformer", "a.bin"),), r"transformer=a\.bin: unsupported file type; a component file is one of "
                                   r"\.safetensors, \.gguf"),
    ((("vae", "a.gguf"), ("vae", "b.gguf")), r"'vae' is given twice"),
    ((("transformer", ""),), r"entries are \(name, file\) strings"),
])
def test_bad_overrides_are_deploy_errors(components, message):
    with pytest.raises(DeployError, match=message):
        DeployConfig(components=components)


def test_python_callers_may_give_a_mapping_or_paths():
    config = DeployConfig(components={"transformer": Path("/m/t.safetensors"), "vae": "/m/v.gguf"})
    assert config.components == (("transformer", "/m/t.safetensors"), ("vae", "/m/v.gguf"))
    assert hash(config) == hash(DeployConfig(components=(("transformer", "/m/t.safetensors"), ("vae", "/m/v.gguf"))))
    with pytest.raises(DeployError, match=r"maps component names to files"):
        DeployConfig(components=["transformer"])


def test_from_pretrained_refuses_a_component_the_checkpoint_has_no_file_for(tmp_path):
    from tests.helpers.wan_checkpoints import TINY_A, write_tiny_wan
    from vidloom.generator import VideoGenerator

    folder = write_tiny_wan(tmp_path / "wan", TINY_A)
    file = tmp_path / "t2.safetensors"
    file.write_bytes(b"")
    with pytest.raises(DeployError, match=r"reads no file for component 'transformer_2'; it takes one for: "
                                          r"transformer, vae"):
        VideoGenerator.from_pretrained(folder, device="cpu", components={"transformer_2": file})
