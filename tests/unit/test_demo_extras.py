"""A demo whose extra is not installed says which extra in one line, never a traceback (#39)."""

from __future__ import annotations

import sys

from vidloom import cli


def test_adapter_demo_without_diffusers_names_the_extra(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "diffusers", None)  # `import diffusers` raises ImportError, as when absent
    monkeypatch.setenv("VIDLOOM_CACHE", str(tmp_path / "cache"))
    code = cli.main(["generate", "--model", "diffusers-adapter-demo", "--prompt", "a cat", "-o", str(tmp_path / "x.mp4")])
    err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("note: ")]
    assert code == 2 and len(err) == 1, err  # the card's notes, then one error line
    assert err[0].startswith("error: diffusers-adapter-demo runs CogVideoX through diffusers") and \
        "pip install 'vidloom[diffusers]'" in err[0]
    assert not (tmp_path / "x.mp4").exists()


def test_the_demos_extra_holds_what_every_demo_needs():
    import tomllib
    from pathlib import Path

    extras = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())[
        "project"]["optional-dependencies"]
    assert extras["demos"] == ["vidloom[diffusers,audio]"]
    assert any(dep.startswith("torchsde") for dep in extras["audio"])
    assert any(dep.startswith("diffusers") for dep in extras["diffusers"])
    assert {dep.split(">")[0] for dep in extras["docs"]} == {"mkdocs", "mkdocs-material"}
