"""The playground switch: on by default on loopback only, `--ui` / `--no-ui`, the `ui` deployment-card key."""

from __future__ import annotations

from pathlib import Path

import pytest

from vidloom.cli import build_parser
from vidloom.serving.config import ServeConfig
from vidloom.serving.guard import UI_PATHS, RequestGuard
from vidloom.serving.serve_flags import effective_config, typed_flags
from vidloom.serving.ui_routes import UI_FILES


def _effective(argv: list[str]) -> ServeConfig:
    parser = build_parser()
    return effective_config(parser.parse_args(argv), typed_flags(parser, argv))


@pytest.mark.parametrize(("host", "ui", "enabled"), [
    ("127.0.0.1", None, True), ("localhost", None, True), ("::1", None, True),
    ("0.0.0.0", None, False), ("10.0.0.5", None, False),  # a network bind shows no page unless asked
    ("0.0.0.0", True, True), ("127.0.0.1", False, False),
])
def test_the_playground_is_on_by_default_on_loopback_only(host: str, ui: bool | None, enabled: bool):
    assert ServeConfig(host=host, ui=ui).ui_enabled is enabled


def test_no_ui_flag_and_card_key(tmp_path: Path, monkeypatch):
    monkeypatch.delenv("VIDLOOM_API_KEY", raising=False)
    assert _effective(["serve"]).ui is None
    assert _effective(["serve", "--no-ui"]).ui is False
    card = tmp_path / "deploy.yaml"
    card.write_text("ui: false\n")
    assert _effective(["serve", "--config", str(card)]).ui is False
    assert _effective(["serve", "--config", str(card), "--ui"]).ui is True  # a typed flag wins over the card


def test_the_page_is_open_without_the_key_but_nothing_else_is():
    guard = RequestGuard(None, ServeConfig(api_key="k"))  # type: ignore[arg-type]
    for path in UI_PATHS:
        assert guard.refusal({"method": "GET", "path": path, "headers": []}) is None
    assert guard.refusal({"method": "GET", "path": "/v1/models", "headers": []})[0] == 401  # type: ignore[index]
    off = RequestGuard(None, ServeConfig(api_key="k", ui=False))  # type: ignore[arg-type]
    assert off.refusal({"method": "GET", "path": "/", "headers": []})[0] == 401  # type: ignore[index]
    assert set(UI_PATHS) == set(UI_FILES)


def test_the_ui_files_are_package_data():
    pyproject = (Path(__file__).parents[3] / "pyproject.toml").read_text()
    assert '"vidloom.serving" = ["ui/*.html", "ui/*.js", "ui/*.css"]' in pyproject
    folder = Path(__file__).parents[3] / "vidloom" / "serving" / "ui"
    assert sorted(p.name for p in folder.iterdir()) == sorted(name for name, _ in UI_FILES.values())
