"""Checkpoints from the Hugging Face hub: a complete cached copy first, the network with timeouts after.

A repo id already downloaded in full is used from the cache without any network request, so a run
starts offline and never waits on the hub. Otherwise huggingface_hub fetches it, with connect and read
timeouts on every request: its repository lookup has none of its own, and a hub that accepts the
connection but never answers would otherwise hang the run. Every failure becomes one HubError line
that says what to do.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

# What a snapshot download needs: weights, configs, tokenizer and templates.
HUB_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.jinja"]
# Seconds to wait for a connection, and for the next bytes of an answer ($MLXASR_HUB_TIMEOUT).
CONNECT_TIMEOUT = 10.0
READ_TIMEOUT = 60.0
TIMEOUT_ENV = "MLXASR_HUB_TIMEOUT"


class HubError(Exception):
    """The repo could not be found in the cache nor fetched; the message says why and what to do."""


def read_timeout() -> float:
    value = os.environ.get(TIMEOUT_ENV)
    try:
        seconds = float(value) if value else READ_TIMEOUT
    except ValueError:
        return READ_TIMEOUT
    return seconds if seconds > 0 else READ_TIMEOUT


def is_complete(path: Path) -> bool:
    """Whether a snapshot folder holds a config, a tokenizer and every weight file it names."""
    if not (path / "config.json").is_file():
        return False
    if not ((path / "tokenizer.json").is_file() or (path / "vocab.json").is_file()):
        return False
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (OSError, ValueError, KeyError, TypeError):
            return False
        return bool(shards) and all((path / name).is_file() for name in shards)
    return any(path.glob("*.safetensors"))


def cached_snapshot(repo: str) -> Path | None:
    """The repo's complete snapshot in the local cache, or None; never touches the network."""
    from huggingface_hub import snapshot_download

    try:
        path = Path(snapshot_download(repo, allow_patterns=HUB_PATTERNS, local_files_only=True))
    except Exception:  # not cached, or cached in part
        return None
    return path if is_complete(path) else None


_timeouts_installed = False


def _install_timeouts() -> None:
    """Give every huggingface_hub request connect and read timeouts unless it sets its own."""
    global _timeouts_installed
    if _timeouts_installed:
        return
    timeout = (CONNECT_TIMEOUT, read_timeout())
    try:
        from huggingface_hub.utils import _http
    except ImportError:
        return
    if hasattr(_http, "configure_http_backend") and hasattr(_http, "_GLOBAL_BACKEND_FACTORY"):
        factory = _http._GLOBAL_BACKEND_FACTORY  # requests backend (huggingface_hub < 1.0)

        def timed_session():
            session = factory()
            request = session.request

            def timed(method, url, *args, **kwargs):
                if kwargs.get("timeout") is None:
                    kwargs["timeout"] = timeout
                return request(method, url, *args, **kwargs)

            session.request = timed
            return session

        _http.configure_http_backend(backend_factory=timed_session)
    elif hasattr(_http, "set_client_factory") and hasattr(_http, "default_client_factory"):
        # huggingface_hub >= 1.0: an httpx client (the module is `httpx` or, from 2.0, `httpx2`);
        # its own Timeout class is used, whichever module that is.

        def timed_client():
            client = _http.default_client_factory()
            client.timeout = type(client.timeout)(timeout[1], connect=timeout[0])
            return client

        _http.set_client_factory(timed_client)
    _timeouts_installed = True


def snapshot(repo: str) -> Path:
    """A local folder with the repo's checkpoint: from the cache when complete, else downloaded."""
    cached = cached_snapshot(repo)
    if cached is not None:
        return cached
    from huggingface_hub import constants, snapshot_download

    if constants.HF_HUB_OFFLINE:
        raise HubError(
            f"{repo}: not in the local Hugging Face cache, and HF_HUB_OFFLINE is set; "
            "download it once with the network on, or give a checkpoint folder"
        )
    _install_timeouts()
    try:
        return Path(snapshot_download(repo, allow_patterns=HUB_PATTERNS))
    except Exception as e:
        raise HubError(f"{repo}: {_reason(e)}") from e


def _chain(e: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    while e is not None and e not in out:
        out.append(e)
        e = e.__cause__ or e.__context__
    return out


def _reason(e: Exception) -> str:
    name = type(e).__name__
    text = " ".join(str(e).split())
    if any("Timeout" in type(x).__name__ or "timed out" in str(x).lower() for x in _chain(e)):
        return (
            f"the Hugging Face hub did not answer within {read_timeout():g} s; check the network, set "
            f"{TIMEOUT_ENV} to wait longer, or give a local checkpoint folder"
        )
    if name in ("RepositoryNotFoundError", "GatedRepoError"):
        return "no such repository on the Hugging Face hub, or it needs a login (huggingface-cli login)"
    if name in ("LocalEntryNotFoundError", "ConnectionError", "OfflineModeIsEnabled"):
        return (
            "cannot reach the Hugging Face hub and no complete copy is cached; check the network, "
            "or give a local checkpoint folder"
        )
    return f"cannot fetch from the Hugging Face hub ({name}: {text[:300]})"
