"""The server's answers to requests it cannot serve: OpenAI-style error bodies, never a path, a traceback
or the key."""

from __future__ import annotations

import http
import json
import logging
from collections.abc import Callable
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from mlx_qwen3asr.runtime.messages import one_line

__all__ = ["APIError", "ClientGone", "http_error", "internal_error", "route", "too_large"]

log = logging.getLogger("mlx_qwen3asr.serve.app")


class APIError(Exception):
    """A request that cannot be served: its status and the OpenAI-style error body.

    close=True asks the client to close the connection: the request body was not read to its end.
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
        close: bool = False,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, one_line(message), code, param
        self.headers = dict(headers or {})
        if close:
            self.headers["Connection"] = "close"

    @property
    def type(self) -> str:
        return "server_error" if self.status >= 500 else "invalid_request_error"

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)

    def raw(self) -> bytes:
        """The whole HTTP/1.1 response as bytes, for the connection itself to write before it closes."""
        body = json.dumps(self.body()).encode()
        try:
            phrase = http.HTTPStatus(self.status).phrase
        except ValueError:
            phrase = ""
        headers = {"content-type": "application/json", "content-length": str(len(body))}
        headers.update({k.lower(): v for k, v in self.headers.items()})
        headers["connection"] = "close"
        head = f"HTTP/1.1 {self.status} {phrase}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        return (head + "\r\n").encode("latin-1") + body


class ClientGone(Exception):
    """The client closed the connection before its answer was ready."""


def too_large(limit: int, close: bool = False) -> APIError:
    """The 413 for a request body over `limit` bytes."""
    mb = limit / (1024 * 1024)
    return APIError(
        413,
        f"the request is larger than this server's limit of {mb:g} MB",
        code="file_too_large",
        param="file",
        close=close,
    )


def route(handler: Callable[[Request], Any]) -> Callable[[Request], Any]:
    """A route's handler whose APIError becomes its answer (logged when the server is at fault)."""

    async def endpoint(request: Request) -> Response:
        try:
            return await handler(request)
        except APIError as e:
            if e.status >= 500:
                log.warning("%s %s: %d %s", request.method, request.url.path, e.status, e.message)
            return e.response()
        except ClientGone:
            log.info("%s %s: the client went away", request.method, request.url.path)
            return Response(status_code=400)  # nobody reads it

    return endpoint


async def http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    messages = {404: f"no route {request.url.path!r}", 405: f"method {request.method} not allowed here"}
    message = messages.get(exc.status_code, one_line(exc.detail))
    return APIError(exc.status_code, message, headers=exc.headers).response()


async def internal_error(request: Request, exc: Exception) -> Response:
    log.error("%s %s failed", request.method, request.url.path, exc_info=(type(exc), exc, exc.__traceback__))
    return APIError(500, "internal error; see the server log", code="internal_error").response()
