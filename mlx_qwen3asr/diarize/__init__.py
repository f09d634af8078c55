"""Who spoke when: speaker diarization with speakrs, and the speakers given to a transcript's words.

    diarizer = load_diarizer("models/diarizer")       # a folder with the model files; None: the hub
    turns = diarizer(samples, DiarizeOptions(max_speakers=4), speech=[(0.4, 9.8), (12.0, 30.5)])
    result = assign_speakers(result, turns, names=["Alice", "Bob"])

The diarizer is speakrs (Apache-2.0), which runs pyannote's community-1 pipeline (segmentation-3.0,
WeSpeaker ResNet34 embeddings, PLDA and VBx clustering) with its own kernels on safetensors and .npy
files: no torch, no ONNX Runtime. It is an optional dependency (`pip install "mlx-qwen3asr[diarize]"`,
Python 3.11 or newer), imported only when a diarizer is loaded. speakrs releases the GIL while it
works, so a diarizer runs on a thread beside transcription. It runs in the platform's accelerated mode
where the installed speakrs has one (CoreML on Apple silicon, CUDA beside an NVIDIA driver), else on
the CPU.

speakrs has no setting for the number of speakers. DiarizeOptions' counts are reached by clustering
again with another AHC threshold (a speaker of VBx can only come from an AHC cluster, so a higher
threshold gives no more speakers): each try is a full run, and at most two more are made.
When no threshold tried gives a count in the range, the closest result is kept and its `warnings` say
so. One speaker (num_speakers or max_speakers 1) needs no run at all.

load_diarizer(path, isolated=True) runs the library in a worker process instead, which cancel() kills:
speakrs alone stops only between its stages, minutes apart on long audio (what the server uses).

The package: `turns` (Turn, Turns, DiarizeOptions, DiarizeProgress, the errors), `diarizer` (the
Diarizer), `loading` (load_diarizer and the execution mode), `process` (the worker process, from the
parent's side) and `worker` (the script it runs: the standard library, numpy and speakrs only),
`speakers` (assign_speakers), `rttm`, `given` (what a diarizer is given: samples, the speech found),
`queue` (DiarizeQueue: one diarizer's jobs on a worker thread, with cancelling and progress, which the
commands and the server share).
"""

from __future__ import annotations

from mlx_qwen3asr.diarize.diarizer import Diarizer
from mlx_qwen3asr.diarize.given import diarize_speech, read_samples, speech_seconds
from mlx_qwen3asr.diarize.loading import load_diarizer
from mlx_qwen3asr.diarize.rttm import rttm_lines
from mlx_qwen3asr.diarize.speakers import OVERLAP_SHARE, assign_speakers, speaker_label, split_at_speakers
from mlx_qwen3asr.diarize.turns import (
    INSTALL_COMMAND,
    SAMPLE_RATE,
    SPEAKRS_VERSION,
    DiarizeCancelled,
    DiarizeOptions,
    DiarizeProgress,
    DiarizerError,
    DiarizerLoadError,
    DiarizerUnavailable,
    Turn,
    Turns,
)

__all__ = [
    "INSTALL_COMMAND",
    "OVERLAP_SHARE",
    "SAMPLE_RATE",
    "SPEAKRS_VERSION",
    "DiarizeCancelled",
    "DiarizeOptions",
    "DiarizeProgress",
    "Diarizer",
    "DiarizerError",
    "DiarizerLoadError",
    "DiarizerUnavailable",
    "Turn",
    "Turns",
    "assign_speakers",
    "diarize_speech",
    "load_diarizer",
    "read_samples",
    "rttm_lines",
    "speaker_label",
    "speech_seconds",
    "split_at_speakers",
]
