"""What the library's routes share: ids from the path, paging parameters, lists, titles, JSON bodies, and
the library's refusals as API errors."""

from __future__ import annotations

import json
import re
import unicodedata
from typing import Any

import anyio
from starlette.requests import Request
from starlette.responses import JSONResponse

from mlx_qwen3asr.library.search import SearchError
from mlx_qwen3asr.library.store import Conflict, LibraryError, NotFound
from mlx_qwen3asr.runtime.messages import one_line
from mlx_qwen3asr.serve.errors import APIError

MAX_JSON_BYTES = 4 * 1024 * 1024  # a PATCH or re-time body
MAX_LIMIT = 500
ID = re.compile(r"[0-9a-f]{6,64}")


def path_id(request: Request, what: str) -> str:
    value = request.path_params["id"]
    if not ID.fullmatch(value):
        raise APIError(404, f"no {what} {value[:80]!r}", code=f"{what}_not_found")
    return value


def int_param(request: Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise APIError(400, f"{name} must be a whole number, got {raw[:40]!r}", param=name) from None
    if not low <= value <= high:
        raise APIError(400, f"{name} must be between {low} and {high}, got {value}", param=name)
    return value


def as_list(data: list[Any], total: int | None = None) -> JSONResponse:
    body: dict[str, Any] = {"object": "list", "data": data}
    if total is not None:
        body["total"] = total
    return JSONResponse(body)


def clean_title(value: str | None) -> str:
    text = "".join(c for c in (value or "") if unicodedata.category(c)[0] != "C")
    return text.strip()[:500]


async def json_body(request: Request) -> dict[str, Any]:
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_JSON_BYTES:
            raise APIError(413, f"the JSON body is larger than {MAX_JSON_BYTES // (1024 * 1024)} MB")
    try:
        doc = json.loads(bytes(body) or b"{}")
    except (ValueError, UnicodeDecodeError) as e:
        raise APIError(400, f"the body is not valid JSON ({one_line(e)})") from None
    if not isinstance(doc, dict):
        raise APIError(400, "the body must be a JSON object")
    return doc


async def library_call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """fn off the event loop; the library's refusals as API errors."""
    try:
        return await anyio.to_thread.run_sync(lambda: fn(*args, **kwargs))
    except NotFound as e:
        raise APIError(404, one_line(e), code="not_found") from None
    except Conflict as e:
        raise APIError(409, one_line(e), code="revision_conflict") from None
    except SearchError as e:
        raise APIError(400, one_line(e), param="q", code="invalid_search") from None
    except LibraryError as e:
        raise APIError(400, one_line(e)) from None
