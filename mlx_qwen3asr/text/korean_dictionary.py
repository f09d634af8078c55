"""The official Korean dictionary that scores soynlp's word cut: found installed, cached, or fetched.

The official package ships the dictionary that its Korean word cut is scored with; nothing of that
package ships with this one. korean_dictionary_path finds the file in an installed copy of the official
package (without importing it), else in our cache when its checksum is right, else fetches the official
wheel from PyPI's simple index, checks it, and keeps only the dictionary in the cache.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import os
import time
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path

from mlx_qwen3asr.runtime.atomic import atomic_write_bytes

__all__ = [
    "KOREAN_DICT_NAME",
    "KOREAN_DICT_SHA256",
    "OFFICIAL_PACKAGE",
    "OFFICIAL_VERSION",
    "PYPI_INDEX_URL",
    "KoreanDictionaryError",
    "cache_dir",
    "cached_korean_dictionary",
    "download_korean_dictionary",
    "installed_korean_dictionary",
    "korean_dictionary_path",
]


# The official package and the file of it that scores Korean word prefixes. Nothing of that package
# ships with this one: the file is found in an installed copy, in our cache, or fetched from PyPI.
OFFICIAL_PACKAGE = "qwen_asr"
OFFICIAL_VERSION = "0.0.6"
KOREAN_DICT_NAME = "korean_dict_jieba.dict"
KOREAN_DICT_MEMBER = f"{OFFICIAL_PACKAGE}/inference/assets/{KOREAN_DICT_NAME}"
# sha256 of qwen_asr/inference/assets/korean_dict_jieba.dict in qwen-asr 0.0.6 (275,834 bytes).
KOREAN_DICT_SHA256 = "cc157a9ab78f92bf11ed98a69b285768d6627cf5cd57a581e6c06693effce37d"
# PyPI's simple index in its JSON form (PEP 691): served by pypi.org and by the mirrors that pip uses.
PYPI_INDEX_URL = "https://pypi.org/simple/qwen-asr/"
SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"
CACHE_SUBDIR = "mlx-qwen3asr"
# Seconds to wait for a connection and for each read of an answer; the whole fetch of one file must
# also end within DOWNLOAD_DEADLINE seconds, and no answer may exceed DOWNLOAD_MAX_BYTES.
DOWNLOAD_TIMEOUT = 20.0
DOWNLOAD_DEADLINE = 120.0
DOWNLOAD_MAX_BYTES = 64 * 1024 * 1024
DICT_MAX_BYTES = 16 * 1024 * 1024


class KoreanDictionaryError(RuntimeError):
    """The Korean dictionary is neither installed, nor cached, nor could it be fetched.

    The message names every place that was tried and why it failed.
    """


def cache_dir() -> Path:
    """Our cache folder: $XDG_CACHE_HOME/mlx-qwen3asr, else ~/.cache/mlx-qwen3asr."""
    base = os.environ.get("XDG_CACHE_HOME")
    root = Path(base) if base else Path.home() / ".cache"
    return root / CACHE_SUBDIR


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def installed_korean_dictionary() -> Path | None:
    """The dictionary of an installed official package, located without importing that package.

    The installed copy is used as it is (it is the file the installed official code uses), so its
    checksum is not compared with KOREAN_DICT_SHA256.
    """
    try:
        spec = importlib.util.find_spec(OFFICIAL_PACKAGE)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        path = Path(location) / "inference" / "assets" / KOREAN_DICT_NAME
        if path.is_file():
            return path
    return None


def cached_korean_dictionary() -> Path:
    """Where our cache keeps the dictionary (the file may not exist)."""
    return cache_dir() / KOREAN_DICT_NAME


def _read_limited(url: str, limit: int, deadline: float, accept: str | None = None) -> bytes:
    headers = {"User-Agent": "mlx-qwen3asr"}
    if accept:
        headers["Accept"] = accept
    request = urllib.request.Request(url, headers=headers)
    chunks: list[bytes] = []
    total = 0
    with urllib.request.urlopen(request, timeout=DOWNLOAD_TIMEOUT) as response:
        while True:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url}: not received within {DOWNLOAD_DEADLINE:.0f} s")
            chunk = response.read(1 << 16)
            if not chunk:
                break
            total += len(chunk)
            if total > limit:
                raise ValueError(f"{url}: answer larger than {limit} bytes")
            chunks.append(chunk)
    return b"".join(chunks)


def _wheel_url(index: dict, base: str) -> tuple[str, str | None]:
    """The URL of the official wheel in a simple-index answer (PEP 691), and its published sha256."""
    entries = index.get("files") if isinstance(index, dict) else None
    if not isinstance(entries, list):
        raise ValueError("the package index lists no files")
    prefix = f"qwen_asr-{OFFICIAL_VERSION}-"  # the distribution's wheel names
    wheels = [
        entry
        for entry in entries
        if isinstance(entry, dict)
        and str(entry.get("filename", "")).startswith(prefix)
        and str(entry.get("filename", "")).endswith(".whl")
        and isinstance(entry.get("url"), str)
    ]
    if not wheels:
        raise ValueError(f"the package index lists no wheel of qwen-asr {OFFICIAL_VERSION}")
    wheels.sort(key=lambda entry: "py3-none-any" not in entry["filename"])
    hashes = wheels[0].get("hashes")
    digest = hashes.get("sha256") if isinstance(hashes, dict) else None
    return urllib.parse.urljoin(base, wheels[0]["url"]), digest if isinstance(digest, str) else None


def download_korean_dictionary(destination: Path | None = None) -> Path:
    """Fetch the dictionary from the official wheel on PyPI into `destination` (default: our cache).

    Reads PYPI_INDEX_URL (the simple index, JSON form) for the wheel's URL, downloads the wheel (checked against its published
    sha256 when the answer gives one), extracts only KOREAN_DICT_MEMBER, checks it against
    KOREAN_DICT_SHA256 and writes it atomically. Raises OSError (network, timeouts, disk),
    ValueError (malformed answers, a wrong checksum) or zipfile.BadZipFile; nothing is written then.
    """
    destination = destination or cached_korean_dictionary()
    deadline = time.monotonic() + DOWNLOAD_DEADLINE
    try:
        answer = _read_limited(PYPI_INDEX_URL, 1 << 22, deadline, accept=SIMPLE_JSON)
        index = json.loads(answer.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{PYPI_INDEX_URL}: not a JSON answer") from error
    url, wheel_digest = _wheel_url(index, PYPI_INDEX_URL)
    wheel = _read_limited(url, DOWNLOAD_MAX_BYTES, deadline)
    if wheel_digest is not None and _sha256(wheel) != wheel_digest.lower():
        raise ValueError(f"{url}: the wheel does not match the sha256 PyPI publishes for it")
    with zipfile.ZipFile(io.BytesIO(wheel)) as archive:
        try:
            info = archive.getinfo(KOREAN_DICT_MEMBER)
        except KeyError as error:
            raise ValueError(f"{url}: the wheel has no {KOREAN_DICT_MEMBER}") from error
        if info.file_size > DICT_MAX_BYTES:
            raise ValueError(f"{url}: {KOREAN_DICT_MEMBER} is implausibly large ({info.file_size} bytes)")
        data = archive.read(info)
    digest = _sha256(data)
    if digest != KOREAN_DICT_SHA256:
        raise ValueError(
            f"{url}: {KOREAN_DICT_MEMBER} has sha256 {digest}, expected {KOREAN_DICT_SHA256}; refused"
        )
    destination.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(destination, data)
    return destination


def korean_dictionary_path(download: bool = True) -> Path:
    """The official Korean dictionary: (a) an installed qwen_asr's copy, (b) our cache when its
    checksum is right, (c) when `download`, a copy fetched from the official wheel on PyPI into the
    cache. Raises KoreanDictionaryError saying why each of them failed."""
    installed = installed_korean_dictionary()
    if installed is not None:
        return installed
    reasons = [f"no installed {OFFICIAL_PACKAGE} package holds {KOREAN_DICT_NAME}"]
    cached = cached_korean_dictionary()
    if cached.is_file():
        try:
            digest = _sha256(cached.read_bytes())
        except OSError as error:
            reasons.append(f"the cached {cached} cannot be read ({error})")
        else:
            if digest == KOREAN_DICT_SHA256:
                return cached
            reasons.append(f"the cached {cached} has the wrong sha256 ({digest})")
    else:
        reasons.append(f"{cached} does not exist")
    if not download:
        reasons.append("downloading was not allowed")
        raise KoreanDictionaryError("; ".join(reasons))
    try:
        return download_korean_dictionary(cached)
    except (OSError, ValueError, zipfile.BadZipFile) as error:
        reasons.append(f"fetching qwen-asr {OFFICIAL_VERSION} from PyPI failed ({error})")
    raise KoreanDictionaryError("; ".join(reasons))
