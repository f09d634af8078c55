"""The outputs' name that `mlxasr live --name NAME` gives: one file name, its extension dropped."""

from __future__ import annotations

import os
import unicodedata

from mlx_qwen3asr.audio.features import AUDIO_EXTENSIONS
from mlx_qwen3asr.outputs.render import FORMATS, SPEAKER_FORMATS

__all__ = ["outputs_name"]

# Extensions dropped from NAME: --name talk.wav (or talk.srt) names the outputs talk.txt, talk.srt, ...
DROPPED = frozenset(AUDIO_EXTENSIONS) | frozenset(FORMATS) | frozenset(SPEAKER_FORMATS)
_SEPARATORS = {"/", "\\", os.sep, os.altsep} - {None}


def outputs_name(name: str) -> str:
    """NAME as the outputs' name, an audio or output extension dropped ("talk.wav" -> "talk").

    Raises ValueError, saying why, for what cannot name a file in the output folder: nothing, "." or
    "..", a path (a separator in it), or a control character (a newline, a tab, ...)."""
    if any(unicodedata.category(ch) == "Cc" for ch in name):
        raise ValueError("a control character (a newline, a tab, ...) is in it; give a plain name, e.g. talk")
    if name in ("", ".", "..") or any(sep in name for sep in _SEPARATORS):
        raise ValueError("give a file name without folder, e.g. talk (the folder goes with -o DIR)")
    base, ext = os.path.splitext(name)
    return base if base and ext[1:].lower() in DROPPED else name
