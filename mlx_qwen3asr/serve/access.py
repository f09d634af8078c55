"""Who the server answers: the Host header must name it, a browser's request must come from an allowed
origin (DNS rebinding, cross-site forms), every request must carry the API key when there is one, and a
declared body must fit the upload limit. Checked before anything reads the request; the realtime
WebSocket is refused by the same checks (refusal), its key also accepted as a subprotocol. The web page's
own files (page.py) need no key; everything they call does."""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass

from starlette.datastructures import Headers
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from mlx_qwen3asr.runtime.messages import one_line
from mlx_qwen3asr.serve.errors import APIError, too_large
from mlx_qwen3asr.serve.page import is_public

__all__ = ["Access", "Guard", "authorized", "close_after", "cross_origin", "refusal"]

# Host names always accepted in the Host header (besides the address the server is bound to).
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")
# Addresses that bind every interface: clients then name the machine by any of its addresses.
WILDCARD_ADDRESSES = ("", "0.0.0.0", "::")
# A refused request's body is dropped by the connection as it arrives, up to this many times the upload
# limit; past that the connection is closed instead (see close_after).
DISCARD_FACTOR = 4


def authorized(header: str | None, key: str) -> bool:
    """Whether an Authorization header carries `Bearer <key>`, compared in constant time."""
    scheme, _, token = (header or "").strip().partition(" ")
    if scheme.lower() != "bearer":
        return False
    # Headers arrive decoded as latin-1: encoding back gives the bytes the client sent.
    return hmac.compare_digest(token.strip().encode("latin-1"), key.encode("utf-8"))


def close_after(headers: Headers, limit: int) -> bool:
    """Whether to close the connection after refusing a request without reading its body.

    Left open, the connection drops the rest of the body as it arrives (nothing stores it), so that a
    client still sending it gets the answer (closing with unread data resets the connection, which
    clients report as a network error, and the OpenAI client then retries). A declared body of more
    than DISCARD_FACTOR times the limit is not worth taking in just to drop: the connection closes.
    """
    try:
        return int(headers.get("content-length", "0")) > DISCARD_FACTOR * limit
    except ValueError:
        return True


def _host_name(value: str) -> str:
    """The name in a Host header (or an origin's host), without port or IPv6 brackets, lowercased."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:].partition("]")[0]
    if value.count(":") == 1:
        value = value.partition(":")[0]
    return value.rstrip(".")


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class Access:
    """Which Host headers and which browser origins are served.

    A page on another site can send a form to the server (a multipart POST needs no CORS preflight),
    and through DNS rebinding (its own name made to point at 127.0.0.1) read the answer: so the Host
    header must name this server, and a request carrying an Origin must come from the server's own
    origin or one allowed with --cors-origin.
    """

    hosts: frozenset[str]  # names accepted in Host; "*": any
    any_ip: bool  # bound to every interface: any IP address is accepted in Host (no rebinding names one)
    origins: frozenset[str]  # origins allowed to make cross-origin requests; "*": any

    @classmethod
    def build(cls, host: str, allowed_hosts: Iterable[str], cors_origins: Iterable[str]) -> Access:
        bound = _host_name(host) if host.strip() not in WILDCARD_ADDRESSES else ""
        names = {*LOCAL_HOSTS, *(_host_name(h) if h.strip() != "*" else "*" for h in allowed_hosts)}
        any_ip = not bound
        if bound:
            names.add(bound)
        else:
            with contextlib.suppress(OSError):
                names.add(_host_name(socket.gethostname()))
        origins = {o.strip().rstrip("/").lower() for o in cors_origins if o.strip()}
        return cls(frozenset(names), any_ip, frozenset(origins))

    def host_allowed(self, header: str | None) -> bool:
        if header is None:  # HTTP/1.0 without Host: no browser sends that
            return True
        name = _host_name(header)
        return "*" in self.hosts or name in self.hosts or (self.any_ip and _is_ip(name))

    def cross_origin_allowed(self, origin: str) -> bool:
        return "*" in self.origins or origin in self.origins


def cross_origin(scope: Scope) -> str | None:
    """The Origin of a browser's request or WebSocket from another origin (lowercased, without a
    trailing slash), or None: no Origin, or the server's own (a WebSocket's wss is https's origin)."""
    headers = Headers(scope=scope)
    value = headers.get("origin")
    if value is None:
        return None
    origin = value.strip().rstrip("/").lower()
    scheme = scope.get("scheme", "http")
    scheme = {"ws": "http", "wss": "https"}.get(scheme, scheme)
    return None if origin == f"{scheme}://{(headers.get('host') or '').lower()}" else origin


def is_preflight(scope: Scope) -> bool:
    """Whether an HTTP request is a browser's CORS preflight (it asks whether a request may be sent)."""
    return (
        scope["type"] == "http"
        and scope.get("method") == "OPTIONS"
        and "access-control-request-method" in Headers(scope=scope)
    )


def refusal(
    access: Access,
    api_key: str | None,
    scope: Scope,
    *,
    limit: int | None = None,
    key_protocol: str | None = None,
) -> APIError | None:
    """Why a request (or a WebSocket connection) is refused, or None: the Host header must name this
    server, a cross-origin browser must be allowed, the API key must be given where there is one.

    limit: the upload limit of an HTTP request, whose refusal closes a connection with a large body
    (close_after). key_protocol: a WebSocket's, which may give the key as the subprotocol
    `<key_protocol><key>` (browsers cannot set its headers); its answers speak of connections."""
    headers = Headers(scope=scope)
    close = limit is not None and close_after(headers, limit)
    socket = key_protocol is not None
    host = headers.get("host")
    if not access.host_allowed(host):
        hint = "" if socket else " (start it with --allowed-host NAME to allow a name)"
        return APIError(
            421,
            f"this server does not answer to the host name {one_line(host or '')[:100]!r}{hint}",
            code="host_not_allowed",
            close=close,
        )
    origin = cross_origin(scope)
    if origin is not None and not access.cross_origin_allowed(origin):
        what, hint = (
            ("connections", "")
            if socket
            else ("requests", " (start the server with --cors-origin ORIGIN to allow an origin)")
        )
        return APIError(
            403,
            f"cross-origin {what} from {one_line(origin)[:100]!r} are refused{hint}",
            code="origin_not_allowed",
            close=close,
        )
    if api_key is None or authorized(headers.get("authorization"), api_key):
        return None
    if origin is not None and is_preflight(scope):
        return None  # an allowed origin's CORS preflight carries no key: the request it asks about must
    if socket:
        offered = [p for p in scope.get("subprotocols", []) if p.startswith(key_protocol)]
        if any(authorized(f"Bearer {p[len(key_protocol) :]}", api_key) for p in offered):
            return None
        return APIError(
            401,
            f"missing or incorrect API key: send 'Authorization: Bearer <key>' or the subprotocol "
            f"'{key_protocol}<key>'",
            code="invalid_api_key",
        )
    return APIError(
        401,
        "missing or incorrect API key: send the header 'Authorization: Bearer <key>'",
        code="invalid_api_key",
        headers={"WWW-Authenticate": "Bearer"},
        close=close,
    )


class Guard:
    """Checks every request before anything else reads it: the Host header, the Origin of a browser's
    request (answering CORS preflights for the allowed ones), the API key, then a declared body size."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        access: Access,
        api_key: str | None,
        max_upload_bytes: int,
        path_limits: dict[str, int] | None = None,
    ) -> None:
        """path_limits: the body limit of a path that takes more than max_upload_bytes (the library's jobs)."""
        self.app, self.access, self.api_key, self.max_upload_bytes = app, access, api_key, max_upload_bytes
        self.path_limits = dict(path_limits or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        limit = self.path_limits.get(scope.get("path", ""), self.max_upload_bytes)
        error = refusal(self.access, self.api_key, scope, limit=limit)
        if (
            error is not None
            and error.code == "invalid_api_key"
            and is_public(scope["method"], scope["path"])
        ):
            error = None  # the page's own files: the page asks for the key, then sends it with each call
        origin = cross_origin(scope)
        if origin is not None and (error is None or error.code == "invalid_api_key"):  # an allowed origin
            if error is None and is_preflight(scope):
                await self._preflight(origin, headers)(scope, receive, send)
                return
            send = self._with_cors(send, origin)  # it may read the answer, a refusal for its key too
        if error is not None:
            await error.response()(scope, receive, send)
            return
        declared = headers.get("content-length")
        if declared is not None:
            try:
                size = int(declared)
            except ValueError:
                await APIError(400, "invalid Content-Length header", close=True).response()(
                    scope, receive, send
                )
                return
            if size > limit:
                await too_large(limit, close=close_after(headers, limit)).response()(scope, receive, send)
                return
        await self.app(scope, receive, send)

    @staticmethod
    def _preflight(origin: str, headers: Headers) -> Response:
        """The answer to a browser's CORS preflight from an allowed origin."""
        asked = headers.get("access-control-request-headers", "")
        allowed = ", ".join(h.strip() for h in asked.split(",") if h.strip()) or "authorization, content-type"
        return Response(
            status_code=204,
            headers={
                "Access-Control-Allow-Origin": origin,
                "Access-Control-Allow-Methods": "GET, POST, PATCH, DELETE, OPTIONS",
                "Access-Control-Allow-Headers": allowed,
                "Access-Control-Max-Age": "600",
                "Vary": "Origin",
            },
        )

    @staticmethod
    def _with_cors(send: Send, origin: str) -> Send:
        """send, with the CORS headers that let the allowed origin read the answer."""
        extra = [
            (b"access-control-allow-origin", origin.encode("latin-1", "replace")),
            (b"access-control-expose-headers", b"Retry-After"),
            (b"vary", b"Origin"),
        ]

        async def cors_send(message: dict) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        return cors_send
