"""Quiet loads: transformers' info logs, warnings and loading bars stay off while vidloom loads a model.

The CLI silences them for its whole process (`cli.generate.quiet_third_party`). A Python program owns
its process's logging, so the Python API silences them only around its own loads and then puts back
what the program had.
"""

from __future__ import annotations

import os
import sys
from contextlib import ExitStack, contextmanager
from typing import Iterator

# Libraries whose messages our loads trigger (transformers: text encoders, tokenizers, image processors,
# the demo writers' save_pretrained), with the environment variable that sets each one's verbosity.
LIBRARIES = {"transformers": "TRANSFORMERS_VERBOSITY", "diffusers": "DIFFUSERS_VERBOSITY"}
LOUDER_THAN_ERRORS = ("debug", "info", "warning")  # those variables' values that mean "show me the messages"


@contextmanager
def quiet_loading() -> Iterator[None]:
    """Inside the block, transformers (and diffusers, if imported) log errors only and show no loading bars.

    Left alone: a library whose environment variable asks for more than errors
    (`TRANSFORMERS_VERBOSITY=warning` brings the messages back), and Hugging Face Hub download bars
    (a multi-GB download without progress looks hung). Entered again once a load has imported diffusers
    (the adapter family), it quiets diffusers too.
    """
    with ExitStack() as stack:
        for name, variable in LIBRARIES.items():
            if os.environ.get(variable, "").lower() in LOUDER_THAN_ERRORS:
                continue
            if name == "transformers" or sys.modules.get(name) is not None:  # never import diffusers to quiet it
                stack.enter_context(_quiet(name))
        yield


@contextmanager
def _quiet(library: str) -> Iterator[None]:
    import importlib

    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    logging = importlib.import_module(f"{library}.utils.logging")
    verbosity, bars = logging.get_verbosity(), logging.is_progress_bar_enabled()
    hub_bars = not are_progress_bars_disabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()  # also turns the Hub's bars off: they come back below
    if hub_bars:
        enable_progress_bars()
    try:
        yield
    finally:
        logging.set_verbosity(verbosity)
        if bars:
            logging.enable_progress_bar()
        (enable_progress_bars if hub_bars else disable_progress_bars)()  # the library's switch moved them too
