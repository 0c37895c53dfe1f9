"""Errors in the OpenAI shape `{"error": {message, type, param, code}}`, and the handlers that produce them."""

from __future__ import annotations

import errno
import itertools
import logging
import re
from contextlib import contextmanager
from typing import Callable, Iterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from vidloom.core.errors import (
    CacheBudgetExceeded, Cancelled, InvalidRequest, LimitExceeded, UnknownModel, VidloomError,
)
from vidloom.media.decode_errors import strip_object_reprs
from vidloom.runtime.async_engine import EngineBusy, EngineClosed
from vidloom.serving.job_store import STORE_ERRORS
from vidloom.serving.params import api_field
from vidloom.serving.protocol import ErrorDetail, ErrorResponse

log = logging.getLogger(__name__)

_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 403: "invalid_request_error",
          404: "invalid_request_error", 408: "invalid_request_error",
          409: "invalid_request_error", 413: "invalid_request_error",
          415: "invalid_request_error", 429: "rate_limit_error"}
_HTTP_CODES = {404: "not_found", 405: "method_not_allowed"}
ECHO_CHARS = 64  # a client-sent value quoted back in an error keeps at most this many characters
MESSAGE_CHARS = 2000  # and no error message is longer than this
# An absolute POSIX path of two or more parts, e.g. in an OSError's text.
_ABSOLUTE_PATH = re.compile(r"(?<![\w.~:/-])/(?:[^\s'\"/:,;()\[\]]+/)+([^\s'\"/:,;()\[\]]*)")


class APIError(Exception):
    """Raised by routes; rendered as an OpenAI error body with this status."""

    def __init__(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers


def echo(value: object) -> str:
    """A client-sent value, quoted for an error message and cut to ECHO_CHARS (a 100 KB id is not sent back)."""
    text = value if isinstance(value, str) else str(value)
    if len(text) <= ECHO_CHARS:
        return repr(text)
    return f"{text[:ECHO_CHARS]!r}... ({len(text)} characters)"


def redact_paths(text: str, root: str | None = None) -> str:
    """Error text without the server's absolute paths (names under `root` stay relative, others keep their last
    part) or object addresses (`<... at 0x...>`, decode_errors' rule)."""
    if root:
        text = text.replace(root.rstrip("/") + "/", "")
    return strip_object_reprs(_ABSOLUTE_PATH.sub(lambda m: m.group(1) or "/", text))


def error_response(
    status: int, message: str, *, param: str | None = None, code: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    if len(message) > MESSAGE_CHARS:
        message = message[:MESSAGE_CHARS] + "..."
    if param is not None and len(param) > ECHO_CHARS:
        param = param[:ECHO_CHARS] + "..."
    detail = ErrorDetail(message=message, type=_TYPES.get(status, "server_error"), param=param, code=code)
    return JSONResponse(ErrorResponse(error=detail).model_dump(), status_code=status, headers=headers)


def validation_error(exc: ValidationError | RequestValidationError) -> APIError:
    """The first problem, as a 400 naming the parameter (FastAPI would answer 422)."""
    first = exc.errors()[0]
    names = [part for part in first.get("loc", ()) if part not in ("body", "query", "path")]
    # A nested block's field by its dotted name (action.mode); a list item by the list's name (loras).
    leading = [str(part) for part in itertools.takewhile(lambda part: isinstance(part, str), names)]
    param = ".".join(leading)[:ECHO_CHARS] if leading else (str(names[0])[:ECHO_CHARS] if names else None)
    if first.get("type") == "json_invalid":
        return APIError(400, "request body is not valid JSON", code="invalid_json")
    message = first.get("msg", "invalid value")
    if first.get("type") == "extra_forbidden":
        message = "unknown parameter"
    shown = "(empty field name)" if param == "" else param  # JSON allows a field named ""
    return APIError(400, f"{shown}: {message}" if shown else message, param=param, code="invalid_parameter")


@contextmanager
def engine_errors(rename: Callable[[str], str] = api_field) -> Iterator[None]:
    """Translate runtime exceptions into API errors: 400/404 for the client, 429/503/507 for capacity, 500
    otherwise. `rename` maps a request field to the parameter this route's client sent."""
    try:
        yield
    except UnknownModel as exc:
        raise APIError(404, str(exc), param="model", code="model_not_found") from None
    except InvalidRequest as exc:
        param = rename(exc.field)
        code = "limit_exceeded" if isinstance(exc, LimitExceeded) else "invalid_parameter"
        raise APIError(400, f"{param}: {exc.message}", param=param, code=code) from None
    except EngineBusy as exc:
        headers = {"Retry-After": str(exc.retry_after_s)}
        raise APIError(429, f"{exc}; retry after {exc.retry_after_s}s", code="queue_full", headers=headers) from None
    except (EngineClosed, Cancelled) as exc:
        raise APIError(503, f"the server is shutting down: {exc}", code="shutting_down") from None
    except CacheBudgetExceeded as exc:
        raise APIError(507, f"not enough KV cache budget for this request: {exc}", code="cache_budget_exceeded") from None
    except VidloomError as exc:
        raise APIError(500, f"generation failed: {redact_paths(str(exc))}", code="generation_error") from None
    except STORE_ERRORS as exc:
        raise store_error(exc) from None


def store_error(exc: BaseException, action: str = "the job store cannot be written") -> APIError:
    """507 when the disk is full, else 503: the server's storage failed, not the request."""
    reason = redact_paths(str(exc))
    if _disk_full(exc):
        return APIError(507, f"{action}: {reason}; free disk space on the server and retry", code="storage_full")
    return APIError(503, f"{action}: {reason}", code="storage_unavailable", headers={"Retry-After": "10"})


def _disk_full(exc: BaseException) -> bool:
    return (isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)) or (
        isinstance(exc, STORE_ERRORS) and ("full" in str(exc).lower() or "no space left" in str(exc).lower()))


def install_error_handlers(app: FastAPI) -> None:
    """Every error a client can cause leaves in the OpenAI shape; nothing they send gives a 500."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        count_rejection(request.app, exc.status, exc.code)
        return error_response(exc.status, exc.message, param=exc.param, code=exc.code, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        err = validation_error(exc)
        count_rejection(request.app, err.status, err.code)
        return error_response(err.status, err.message, param=err.param, code=err.code)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # Routing and starlette's own refusals: a code for each, so no error reaches a client with code null.
        code = _HTTP_CODES.get(exc.status_code, "invalid_request" if exc.status_code < 500 else "server_error")
        return error_response(exc.status_code, str(exc.detail), code=code, headers=exc.headers)

    async def _store(request: Request, exc: Exception) -> JSONResponse:
        log.error("job store error on %s %s: %s", request.method, request.url.path, exc)
        err = store_error(exc, "the job store failed")
        return error_response(err.status, err.message, code=err.code, headers=err.headers)

    for error_type in STORE_ERRORS:  # SQLite's and (when installed) psycopg's
        app.add_exception_handler(error_type, _store)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(500, "internal server error", code="internal_error")


def count_rejection(app: object, status: int, code: str | None) -> None:
    """Count a refused request (400 / 408 / 413 / 429) by its error code in the server's metrics.

    The code, not the parameter, is the label: codes are a fixed set, parameter names come from clients.
    """
    if status not in (400, 408, 413, 429):
        return
    jobs = getattr(getattr(app, "state", None), "jobs", None)
    if jobs is not None:
        jobs.metrics.rejected(code or "invalid_request")


def generation_error(exc: BaseException) -> APIError:
    """A model step that raised: the server's fault (500), its message with paths redacted."""
    return APIError(500, f"generation failed: {redact_paths(str(exc))}", code="generation_error")


def error_json(exc: BaseException) -> str:
    """An error event's body (a stream already under way): the OpenAI error shape a refused request would have had."""
    if isinstance(exc, InvalidRequest):
        exc = APIError(400, str(exc), param=exc.field, code="invalid_parameter")
    elif not isinstance(exc, APIError):
        exc = generation_error(exc)
    return error_response(exc.status, exc.message, param=exc.param, code=exc.code).body.decode()
