"""Connections: deadlines for a request's headers and body, and a bound on how many are open, kept by
uvicorn's HTTP/1.1 protocol (h11) made to follow ConnectionLimits."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from starlette.types import ASGIApp, Receive, Scope, Send

from mlx_qwen3asr.serve.errors import APIError

__all__ = ["ConnectionLimits", "http_protocol"]

log = logging.getLogger(__name__)

# Connections: the request line and headers must arrive within HEADER_TIMEOUT seconds of the
# connection opening (or of the previous answer); a body may pause at most BODY_TIMEOUT seconds and
# must average BODY_MIN_RATE bytes a second after its first BODY_TIMEOUT seconds; past
# MAX_CONNECTIONS open connections (WebSockets included), new ones are answered 503 (a WebSocket
# handshake too).
DEFAULT_HEADER_TIMEOUT = 20.0
DEFAULT_BODY_TIMEOUT = 20.0
DEFAULT_BODY_MIN_RATE = 4096.0
DEFAULT_MAX_CONNECTIONS = 256


@dataclass(frozen=True)
class ConnectionLimits:
    """Deadlines for what a client sends, and a bound on open connections (see http_protocol).

    header_timeout: seconds from the connection opening (or the previous answer) to the end of the
    request's headers; a connection that sent part of them then gets 408, one that sent nothing is
    closed. body_timeout: the longest pause in a request body (an HTTP one: a connection upgraded to a
    WebSocket has no deadline here); and after its first body_timeout seconds
    the body must average body_min_rate bytes a second. A body that stalls gets 408 (if nothing was
    answered yet) and the connection closes; its request sees its client gone (its upload is removed).
    max_connections: connections past this many get 503 and are closed; WebSocket connections count
    too, and a WebSocket handshake past the limit is refused with the same 503 (never accepted).
    """

    header_timeout: float = DEFAULT_HEADER_TIMEOUT
    body_timeout: float = DEFAULT_BODY_TIMEOUT
    body_min_rate: float = DEFAULT_BODY_MIN_RATE
    max_connections: int = DEFAULT_MAX_CONNECTIONS


def _too_many_connections(limit: int) -> ASGIApp:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        error = APIError(
            503,
            f"the server has too many open connections (at most {limit}); retry shortly",
            code="too_many_connections",
            headers={"Retry-After": "1"},
            close=True,
        )
        await error.response()(scope, receive, send)

    return app


def http_protocol(limits: ConnectionLimits) -> type[asyncio.Protocol]:
    """uvicorn's HTTP/1.1 protocol (h11) with the deadlines and the bound of `limits`."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class Protocol(H11Protocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._timer: asyncio.TimerHandle | None = None
            self._phase: str | None = None  # "head", "body" or None (the request is in; no deadline)
            self._head_bytes = 0
            self._body_start = self._body_last = 0.0
            self._body_bytes = 0
            self._upgraded = False  # handed over to a WebSocket: no deadline of ours applies any more
            self._refused = len(self.connections) > limits.max_connections
            if self._refused:
                log.warning("refused a connection: %d are open", len(self.connections))
                self.app = _too_many_connections(limits.max_connections)
            self._track()

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel()
            self._phase = None
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            now = self.loop.time()
            if self._phase == "head":
                self._head_bytes += len(data)
            elif self._phase == "body":
                self._body_bytes += len(data)
                self._body_last = now
            super().data_received(data)
            self._track(rearm=self._phase == "body")

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._track()

        def _should_upgrade(self) -> bool:
            # A refused connection is not handed to the WebSocket protocol, which would run the real
            # app: its upgrade request is answered by the 503 app, as any request of it would be.
            return not self._refused and super()._should_upgrade()

        def handle_websocket_upgrade(self, event: h11.Request) -> None:
            # The connection now belongs to the WebSocket protocol (this one receives nothing more):
            # its request has no body to wait for, and a live session ends by its own rules
            # (serve/live.py), never by the deadlines of an HTTP request.
            self._upgraded = True
            self._phase = None
            self._cancel()
            super().handle_websocket_upgrade(event)

        # -- deadlines --

        def _cancel(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _track(self, rearm: bool = False) -> None:
            """Sets the deadline that fits where the request stands."""
            if self._upgraded or self.transport is None or self.transport.is_closing():
                self._cancel()
                return
            state = self.conn.their_state
            if state is h11.IDLE:
                if self._phase != "head":
                    self._phase, self._head_bytes = "head", 0
                    self._cancel()
                    self._timer = self.loop.call_later(limits.header_timeout, self._head_expired)
            elif state is h11.SEND_BODY:
                if self._phase != "body":
                    self._phase, self._body_bytes = "body", 0
                    self._body_start = self._body_last = self.loop.time()
                    rearm = True
                if rearm:
                    self._cancel()
                    delay = max(0.0, self._body_deadline() - self.loop.time())
                    self._timer = self.loop.call_later(delay, self._body_expired)
            else:
                self._phase = None
                self._cancel()

        def _body_deadline(self) -> float:
            idle = self._body_last + limits.body_timeout
            slow = self._body_start + limits.body_timeout + self._body_bytes / limits.body_min_rate
            return min(idle, slow)

        def _head_expired(self) -> None:
            self._timer = None
            if self.transport.is_closing() or self._phase != "head":
                return
            if self._head_bytes:
                log.info("closed a connection: its request headers took over %g s", limits.header_timeout)
                self._close_with(
                    APIError(
                        408,
                        f"the request headers did not arrive within {limits.header_timeout:g} s",
                        code="request_timeout",
                    )
                )
            else:  # an idle connection: closed as a keep-alive one is
                self.transport.close()

        def _body_expired(self) -> None:
            self._timer = None
            if self.transport.is_closing() or self._phase != "body":
                return
            now = self.loop.time()
            if self.flow.read_paused:  # we are not reading (the request is busy): not the client's fault
                self._body_start = self._body_last = now
                self._body_bytes = 0
                self._track(rearm=True)
                return
            if now < self._body_deadline():
                self._track(rearm=True)
                return
            log.info("closed a connection: its request body stalled (%d bytes received)", self._body_bytes)
            cycle = self.cycle
            if cycle is not None and not cycle.response_started:
                self._close_with(
                    APIError(
                        408,
                        f"the request body stopped arriving (no data for {limits.body_timeout:g} s, or "
                        f"less than {limits.body_min_rate:g} bytes a second)",
                        code="request_timeout",
                    )
                )
            else:
                self.transport.close()

        def _close_with(self, error: APIError) -> None:
            cycle = self.cycle
            if cycle is not None and not cycle.response_complete:
                # The request in progress sees its client gone: its sends are dropped, its upload removed.
                cycle.disconnected = True
                cycle.message_event.set()
            self.transport.write(error.raw())
            self.transport.close()

    return Protocol
