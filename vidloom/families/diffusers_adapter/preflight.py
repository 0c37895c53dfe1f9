"""The pipeline's own input check, run at submit: a request the pipeline would refuse is refused before any work.

Diffusers pipelines validate their arguments in `check_inputs`, whose parameters carry the names of `__call__`'s.
We call it with the request's keyword arguments over `__call__`'s defaults; only a ValueError (what the check raises
to refuse) refuses the request. Anything else (a check that needs values the pipeline computes first) leaves the
decision to the call itself, whose errors the loop reports (loop.PipelineFailed). Uploaded images are not decoded
yet at submit: the check sees a blank image of the same size in their place.
"""

from __future__ import annotations

import inspect
from typing import Any, Mapping

from vidloom.families.diffusers_adapter.loop import refusal
from vidloom.media.image import EncodedImage


def check_inputs(pipe: Any, kwargs: Mapping[str, Any], fields: dict[str, str]) -> None:
    """Raise InvalidRequest if `pipe.check_inputs` refuses the call `pipe(**kwargs)` would make."""
    check = getattr(pipe, "check_inputs", None)
    if not callable(check):
        return
    defaults = {name: p.default for name, p in inspect.signature(type(pipe).__call__).parameters.items()
                if p.default is not inspect.Parameter.empty}
    args: dict[str, Any] = {}
    for name, param in inspect.signature(check).parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if name in kwargs:
            args[name] = _undecoded(kwargs[name])
        elif name in defaults:
            args[name] = defaults[name]
        elif param.default is inspect.Parameter.empty:
            args[name] = None
    try:
        check(**args)
    except ValueError as exc:
        raise refusal(type(pipe).__name__, exc, fields) from None
    except Exception:  # the check needs what the call computes first: the call decides
        return


def _undecoded(value: Any) -> Any:
    """`value` with each not yet decoded image replaced by a blank one of its size."""
    if isinstance(value, EncodedImage):
        from PIL import Image

        return Image.new("RGB", value.size)
    if isinstance(value, list):
        return [_undecoded(v) for v in value]
    return value
