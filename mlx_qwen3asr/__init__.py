"""Qwen3-ASR speech recognition on Apple MLX.

import mlx_qwen3asr
model = mlx_qwen3asr.load("Qwen/Qwen3-ASR-0.6B")
result = mlx_qwen3asr.transcribe(model, "talk.m4a")
print(result.text)
"""

from mlx_qwen3asr.runtime.cpu import preload_openblas, tune_malloc

# OpenBLAS must be loaded before MLX is (its symbols win the lookup only then). Malloc is tuned by the
# commands (and tools/bench.py), or by calling tune_malloc(): an import changes nothing else.
preload_openblas()

from mlx_qwen3asr.audio.features import AudioError  # noqa: E402
from mlx_qwen3asr.audio.files import load_audio, read_audio  # noqa: E402
from mlx_qwen3asr.audio.vad import VadOptions, VadUnavailable  # noqa: E402
from mlx_qwen3asr.checkpoints.loading import ASRModel, ModelLoadError, WrongModelError, load, require_kind  # noqa: E402
from mlx_qwen3asr.pipeline.alignment import align  # noqa: E402
from mlx_qwen3asr.pipeline.result import InputResult  # noqa: E402
from mlx_qwen3asr.pipeline.transcribe import Segment, Transcription, transcribe, transcribe_stream  # noqa: E402
from mlx_qwen3asr.text.languages import SUPPORTED_LANGUAGES  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "ASRModel",
    "AudioError",
    "InputResult",
    "ModelLoadError",
    "SUPPORTED_LANGUAGES",
    "align",
    "Segment",
    "Transcription",
    "WrongModelError",
    "load",
    "load_audio",
    "read_audio",
    "require_kind",
    "transcribe",
    "transcribe_stream",
    "tune_malloc",
    "VadOptions",
    "VadUnavailable",
]
