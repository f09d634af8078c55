"""The web page the server shows at `/`: plain HTML, CSS and ES modules kept in the package (web/),
served as they are, with nothing fetched from elsewhere and no build step.

    GET /                 web/index.html
    GET /static/<name>    a file of web/ (its scripts, styles and the audio worklet)

The files are read once, when the app is made, and answered from memory with their MIME type, an ETag
(a 304 to a browser that holds them already) and a Content-Security-Policy that lets the page load and
connect to nothing but this server. They need no API key (they hold none of the user's data); every
request the page makes to the API carries the key (access.Guard).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

__all__ = ["PAGE_PREFIX", "WEB", "Page", "is_public"]

WEB = Path(__file__).with_name("web")
PAGE_PREFIX = "/static/"
TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".mjs": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
    ".txt": "text/plain; charset=utf-8",
}


def is_public(method: str, path: str) -> bool:
    """Whether a request is for the page's own files, which need no API key."""
    return method in ("GET", "HEAD") and (path == "/" or path.startswith(PAGE_PREFIX))


_HOST = re.compile(r"[A-Za-z0-9.:\[\]-]{1,300}")


def _policy(host: str) -> str:
    # The page's own origin only; its WebSocket goes to the host it was loaded from (checked by Guard).
    sockets = f" ws://{host} wss://{host}" if _HOST.fullmatch(host) else ""
    return (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
        f"media-src 'self' blob:; connect-src 'self'{sockets}; worker-src 'self'; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )


@dataclass(frozen=True)
class _File:
    body: bytes
    media_type: str
    etag: str


class Page:
    """The page's files, read from `folder` (default: the package's web/)."""

    def __init__(self, folder: Path = WEB) -> None:
        self.files: dict[str, _File] = {}
        for path in sorted(folder.rglob("*")):
            media_type = TYPES.get(path.suffix)
            if path.is_file() and media_type is not None:
                body = path.read_bytes()
                etag = '"' + hashlib.sha256(body).hexdigest()[:20] + '"'
                self.files[path.relative_to(folder).as_posix()] = _File(body, media_type, etag)
        if "index.html" not in self.files:
            raise FileNotFoundError(f"{folder}: the page's index.html is missing")

    def routes(self) -> list[Route]:
        return [
            Route("/", self.index, methods=["GET", "HEAD"]),
            Route(PAGE_PREFIX + "{name:path}", self.static, methods=["GET", "HEAD"]),
        ]

    async def index(self, request: Request) -> Response:
        return self._answer(request, "index.html")

    async def static(self, request: Request) -> Response:
        return self._answer(request, request.path_params["name"])

    def _answer(self, request: Request, name: str) -> Response:
        file = self.files.get(name)
        if file is None or name == "index.html" and request.url.path != "/":
            return Response(f"no page file {name[:100]!r}\n", 404, media_type="text/plain")
        headers = {
            "ETag": file.etag,
            "Cache-Control": "no-cache",  # always revalidated: a new version is seen at once
            "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer",
        }
        if file.media_type.startswith("text/html"):
            headers["Content-Security-Policy"] = _policy(request.headers.get("host", ""))
            headers["X-Frame-Options"] = "DENY"
        if request.headers.get("if-none-match") == file.etag:
            return Response(status_code=304, headers=headers)
        body = b"" if request.method == "HEAD" else file.body
        response = Response(body, media_type=file.media_type, headers=headers)
        if request.method == "HEAD":
            response.headers["content-length"] = str(len(file.body))
        return response
