"""Errors in the OpenAI shape `{"error": {message, type, param, code}}`, and the handlers that produce them."""

from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Iterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from vidloom.core.errors import Cancelled, InvalidRequest, LimitExceeded, UnknownModel, VidloomError
from vidloom.runtime.async_engine import EngineBusy, EngineClosed
from vidloom.serving.params import api_field
from vidloom.serving.protocol import ErrorDetail, ErrorResponse

log = logging.getLogger(__name__)

_TYPES = {400: "invalid_request_error", 404: "invalid_request_error", 408: "invalid_request_error",
          409: "invalid_request_error",
          413: "invalid_request_error", 429: "rate_limit_error"}


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


def error_response(
    status: int, message: str, *, param: str | None = None, code: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    detail = ErrorDetail(message=message, type=_TYPES.get(status, "server_error"), param=param, code=code)
    return JSONResponse(ErrorResponse(error=detail).model_dump(), status_code=status, headers=headers)


def validation_error(exc: ValidationError | RequestValidationError) -> APIError:
    """The first problem, as a 400 naming the parameter (FastAPI would answer 422)."""
    first = exc.errors()[0]
    names = [str(part) for part in first.get("loc", ()) if part not in ("body", "query", "path")]
    param = names[0] if names else None
    if first.get("type") == "json_invalid":
        return APIError(400, "request body is not valid JSON", code="invalid_json")
    message = first.get("msg", "invalid value")
    if first.get("type") == "extra_forbidden":
        message = "unknown parameter"
    return APIError(400, f"{param}: {message}" if param else message, param=param, code="invalid_parameter")


@contextmanager
def engine_errors() -> Iterator[None]:
    """Translate runtime exceptions into API errors: 400/404 for the client, 429/503 for capacity, 500 otherwise."""
    try:
        yield
    except UnknownModel as exc:
        raise APIError(404, str(exc), param="model", code="model_not_found") from None
    except InvalidRequest as exc:
        param = api_field(exc.field)
        code = "limit_exceeded" if isinstance(exc, LimitExceeded) else "invalid_parameter"
        raise APIError(400, f"{param}: {exc.message}", param=param, code=code) from None
    except EngineBusy as exc:
        headers = {"Retry-After": str(exc.retry_after_s)}
        raise APIError(429, f"{exc}; retry after {exc.retry_after_s}s", code="queue_full", headers=headers) from None
    except (EngineClosed, Cancelled) as exc:
        raise APIError(503, f"the server is shutting down: {exc}", code="shutting_down") from None
    except VidloomError as exc:
        raise APIError(500, f"generation failed: {exc}", code="generation_error") from None


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
        code = "not_found" if exc.status_code == 404 else None
        return error_response(exc.status_code, str(exc.detail), code=code, headers=exc.headers)

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
