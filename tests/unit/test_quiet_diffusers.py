"""The CLI no longer imports diffusers to quiet it (seconds of start-up): the adapter family's load, which does
import it, quiets its loading bars through quiet_loading even with the CLI's DIFFUSERS_VERBOSITY=error set."""

from __future__ import annotations

import os

import pytest


@pytest.mark.parametrize("value", ["error", ""])
def test_quiet_loading_quiets_diffusers_under_the_clis_setting(monkeypatch, value):
    pytest.importorskip("diffusers")
    from diffusers.utils import logging

    from vidloom.loading.quiet import quiet_loading

    monkeypatch.setenv("DIFFUSERS_VERBOSITY", value)
    logging.enable_progress_bar()
    try:
        with quiet_loading():
            assert not logging.is_progress_bar_enabled()
        assert logging.is_progress_bar_enabled()  # put back as it was
    finally:
        logging.enable_progress_bar()


def test_a_louder_setting_leaves_diffusers_alone(monkeypatch):
    pytest.importorskip("diffusers")
    from diffusers.utils import logging

    from vidloom.loading.quiet import quiet_loading

    monkeypatch.setenv("DIFFUSERS_VERBOSITY", "warning")  # `vidloom generate --verbose`
    logging.enable_progress_bar()
    with quiet_loading():
        assert logging.is_progress_bar_enabled()


@pytest.mark.parametrize(("before", "after"), [("error", "warning"), ("", "warning"), ("debug", "debug")])
def test_verbose_shows_at_least_warnings_whatever_the_environment_said(monkeypatch, before, after):
    """`--verbose` under an inherited TRANSFORMERS_VERBOSITY=error (a parent CLI's setting) still shows the loads;
    a louder setting the user chose stays."""
    import warnings

    from vidloom.cli.generate import quiet_third_party

    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)  # quiet_third_party replaces it
    for variable in ("TRANSFORMERS_VERBOSITY", "DIFFUSERS_VERBOSITY"):
        monkeypatch.setenv(variable, before)
    quiet_third_party(verbose=True)
    assert os.environ["TRANSFORMERS_VERBOSITY"] == after and os.environ["DIFFUSERS_VERBOSITY"] == after
