"""A live session kept in the transcript library: its Transcription, with its audio as a 16-bit WAV.

The audio is written to a temporary name in the library's audio folder and moved under its transcript's
name in the transaction that adds the transcript (Library.add with move_audio): a crash leaves either
the whole transcript or an unnamed file that the library removes when it next opens.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import soundfile as sf

from mlx_qwen3asr.audio.features import SAMPLE_RATE
from mlx_qwen3asr.library.files import remove
from mlx_qwen3asr.library.store import Library
from mlx_qwen3asr.pipeline.result import Transcription
from mlx_qwen3asr.runtime.atomic import temp_name

__all__ = ["live_title", "save_live_session"]

# Samples written to the WAV at a time (a minute), so that hours of audio never sit in memory.
BLOCK = 60 * SAMPLE_RATE


def live_title(started: float) -> str:
    """The title a saved live session gets: when it started, in the server's local time."""
    return time.strftime("Live captions %Y-%m-%d %H:%M", time.localtime(started))


def save_live_session(
    library: Library,
    result: Transcription,
    audio: Any,
    *,
    started: float,
    model: str,
    options: dict[str, Any],
) -> str:
    """File a finished live session (`audio`: its kept audio, a Signal of 16 kHz float samples) in the
    library; returns the transcript's id. Raises LibraryError or OSError (a full disk) with nothing left
    behind."""
    wav = Path(library.audio_folder) / (temp_name("live") + ".wav")  # kept as <id>.wav
    try:
        with sf.SoundFile(wav, "x", SAMPLE_RATE, 1, "PCM_16", format="WAV") as out:
            for start in range(0, len(audio), BLOCK):
                out.write(audio.read(start, min(start + BLOCK, len(audio))))
        return library.add(
            result.to_dict(),
            title=live_title(started),
            audio=wav,
            move_audio=True,
            model=model,
            options=options,
            created=started,
        )
    finally:
        remove(wav)
