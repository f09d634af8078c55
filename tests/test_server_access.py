"""One set of checks (mlx_qwen3asr.serve.access.refusal) for who the server answers, used by the HTTP
API's Guard and by the realtime WebSocket, each keeping its own words."""

from __future__ import annotations

import pytest

from mlx_qwen3asr.serve.access import Access, cross_origin, refusal

KEY_PROTOCOL = "openai-insecure-api-key."
ACCESS = Access.build("127.0.0.1", [], ["https://app.example"])


def scope(kind: str = "http", *, method: str = "POST", protocols=(), **headers: str) -> dict:
    headers.setdefault("host", "127.0.0.1:8000")
    raw = [(k.replace("_", "-").encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
    out = {"type": kind, "headers": raw, "scheme": "http" if kind == "http" else "ws"}
    if kind == "http":
        out["method"] = method
    else:
        out["subprotocols"] = list(protocols)
    return out


def answer(s: dict, **kw):
    error = refusal(ACCESS, "k", s, **kw)
    return None if error is None else (error.status, error.code, error.message)


@pytest.mark.parametrize("kind", ["http", "websocket"])
def test_both_paths_refuse_the_same_things(kind):
    key = {"authorization": "Bearer k"}
    socket = {"key_protocol": KEY_PROTOCOL} if kind == "websocket" else {}
    assert answer(scope(kind, **key), **socket) is None
    assert answer(scope(kind, host="evil.example", **key), **socket)[:2] == (421, "host_not_allowed")
    assert answer(scope(kind, origin="https://evil.example", **key), **socket)[:2] == (
        403,
        "origin_not_allowed",
    )
    assert answer(scope(kind, origin="https://app.example", **key), **socket) is None
    assert answer(scope(kind), **socket)[:2] == (401, "invalid_api_key")


def test_each_path_keeps_its_words():
    http = answer(scope(host="evil.example"))[2]
    socket = answer(scope("websocket", host="evil.example"), key_protocol=KEY_PROTOCOL)[2]
    assert http.endswith("(start it with --allowed-host NAME to allow a name)")
    assert socket == "this server does not answer to the host name 'evil.example'"
    http = answer(scope(origin="https://evil.example", authorization="Bearer k"))[2]
    socket = answer(scope("websocket", origin="https://evil.example"), key_protocol=KEY_PROTOCOL)[2]
    assert http.startswith("cross-origin requests from 'https://evil.example' are refused (start")
    assert socket == "cross-origin connections from 'https://evil.example' are refused"
    assert "subprotocol" in answer(scope("websocket"), key_protocol=KEY_PROTOCOL)[2]
    assert "subprotocol" not in answer(scope())[2]


def test_a_socket_may_give_its_key_as_a_subprotocol_and_a_request_may_not():
    offered = [f"{KEY_PROTOCOL}k"]
    assert answer(scope("websocket", protocols=offered), key_protocol=KEY_PROTOCOL) is None
    assert answer(scope("websocket", protocols=[f"{KEY_PROTOCOL}x"]), key_protocol=KEY_PROTOCOL)[0] == 401


def test_only_an_allowed_origins_preflight_goes_without_the_key():
    preflight = {"access_control_request_method": "POST"}
    assert answer(scope(method="OPTIONS", origin="https://app.example", **preflight)) is None
    # The same request from the server's own page (or with no Origin) is no preflight: it needs the key.
    assert answer(scope(method="OPTIONS", origin="http://127.0.0.1:8000", **preflight))[0] == 401
    assert answer(scope(method="OPTIONS", **preflight))[0] == 401


def test_a_secure_socket_from_its_own_https_page_is_same_origin():
    s = scope("websocket", origin="https://127.0.0.1:8000")
    s["scheme"] = "wss"
    assert cross_origin(s) is None
    s["scheme"] = "ws"
    assert cross_origin(s) == "https://127.0.0.1:8000"
