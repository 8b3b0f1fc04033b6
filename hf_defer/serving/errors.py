"""Errors in OpenAI's shape, for both apps: [`openai_error`] builds one, [`RequestError`] is a client's mistake found
while reading a request (400 unless it says otherwise), and [`install_error_handlers`] makes every error an app can
raise (a bad query parameter, an unknown route, a mistake of the client, a bug of the server) a JSON answer in
OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`, which the `openai` client raises with its message.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

__all__ = ["RequestError", "install_error_handlers", "openai_error"]

logger = logging.getLogger(__name__)

_KINDS = {401: "invalid_request_error", 404: "not_found_error", 413: "invalid_request_error",
          429: "rate_limit_error"}


def openai_error(status: int, message: str, kind: str | None = None, param: str | None = None,
                 code: str | int | None = None, headers: Mapping[str, str] | None = None) -> JSONResponse:
    """An error answer in OpenAI's shape (`type` defaults to what OpenAI says for the status, `code` to the status).

    Example:

    ```python
    >>> from hf_defer.serving.errors import openai_error
    >>> response = openai_error(400, "messages must be a list.", param="messages")
    >>> import json
    >>> response.status_code, json.loads(response.body)["error"]["type"], json.loads(response.body)["error"]["param"]
    (400, 'invalid_request_error', 'messages')

    ```
    """
    kind = kind or _KINDS.get(status, "invalid_request_error" if status < 500 else "server_error")
    return JSONResponse({"error": {"message": message, "type": kind, "param": param,
                                   "code": status if code is None else code}},
                        status_code=status, headers=dict(headers or {}))


class RequestError(ValueError):
    """A mistake of the client in its request: the app answers `status` (400 unless said) with `message`, naming the
    field `param`."""

    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.message, self.param, self.status = message, param, status


def install_error_handlers(app: FastAPI) -> None:
    """Every error of `app` in OpenAI's shape: a [`RequestError`] and FastAPI's own validation errors (a query
    parameter of the wrong type) are 4xx, an unknown route 404, a wrong method 405; anything else is a bug of the
    server: 500 with a message that hides its details (the traceback goes to the server's log)."""

    @app.exception_handler(RequestError)
    async def request_error(request: Request, error: RequestError) -> JSONResponse:
        return openai_error(error.status, error.message, param=error.param)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, error: RequestValidationError) -> JSONResponse:
        problems = "; ".join(f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}" for e in error.errors())
        first = error.errors()[0].get("loc", ()) if error.errors() else ()
        return openai_error(400, f"invalid request: {problems}", param=str(first[-1]) if first else None)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        message = f"no route {request.method} {request.url.path}" if error.status_code in (404, 405) else \
            str(error.detail)
        return openai_error(error.status_code, message, headers=getattr(error, "headers", None))

    @app.exception_handler(Exception)
    async def server_error(request: Request, error: Exception) -> JSONResponse:
        logger.error("%s %s failed: %s: %s", request.method, request.url.path, type(error).__name__, error)
        return openai_error(500, f"the server failed on this request ({type(error).__name__}); its log has the "
                            "details.", "server_error")


class _NotJSON(ValueError):
    pass


def _no_constant(name: str) -> Any:
    raise _NotJSON(f"{name} is not a JSON number")


async def read_json_object(request: Request, example: str) -> dict[str, Any]:
    """The request's body as a JSON object, or a [`RequestError`] that says what came instead (not JSON, not UTF-8,
    `NaN` or `Infinity`, which JSON has not and no upstream reads, nested too deeply to parse, not an object)."""
    try:
        body = json.loads(await request.body(), parse_constant=_no_constant)
    except (ValueError, RecursionError) as error:  # UnicodeDecodeError is a ValueError
        reason = "is nested too deeply" if isinstance(error, RecursionError) else "is not valid JSON" + (
            f" ({error})" if isinstance(error, _NotJSON) else "")
        raise RequestError(f"the request body {reason}: expected a JSON object such as {example}.") from None
    if not isinstance(body, dict):
        raise RequestError(f"the request body must be a JSON object such as {example}, got {type(body).__name__}.")
    return body
