"""Edited segments of a stored transcript timed again: the forced aligner times each segment's text against
its own span of the kept audio. Runs where the models run (the Engine's thread, Engine.call)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from mlx_qwen3asr.audio.features import SAMPLE_RATE, log_mel_spectrogram
from mlx_qwen3asr.audio.files import read_audio
from mlx_qwen3asr.checkpoints.loading import ASRModel
from mlx_qwen3asr.pipeline.alignment import align_segments, why_not_aligned

__all__ = ["BATCH", "retime_segments"]

# Segments timed in one padded pass of the aligner.
BATCH = 8


def retime_segments(
    aligner: ASRModel, audio: Path, content: Mapping[str, Any], segment_ids: Iterable[int]
) -> tuple[dict[int, list[dict[str, Any]]], dict[int, str]]:
    """({segment id: its words with times}, {segment id: why it was not timed}) for the given segments of
    content (a stored transcript), read from audio (its kept file) span by span, never whole."""
    by_id = {int(s["id"]): s for s in content.get("segments", [])}
    wanted = [by_id[i] for i in dict.fromkeys(int(i) for i in segment_ids)]
    timed: dict[int, list[dict[str, Any]]] = {}
    skipped: dict[int, str] = {}
    servable: list[tuple[dict[str, Any], tuple[float, float], np.ndarray]] = []
    decoded = read_audio(str(audio))
    signal = decoded.signal
    try:
        total = len(signal)
        for seg in wanted:
            start, end = float(seg["start"]), float(seg["end"])
            a = max(0, min(total, int(round(start * SAMPLE_RATE))))
            b = max(a, min(total, int(round(end * SAMPLE_RATE))))
            text, language = str(seg.get("text") or ""), seg.get("language") or None
            reason = why_not_aligned(aligner, text, language, (b - a) / SAMPLE_RATE)
            if reason is not None or b <= a:
                skipped[int(seg["id"])] = reason or "no audio in its span"
                continue
            servable.append((seg, (start, end), signal.read(a, b)))  # only the spans, never the whole
    finally:
        signal.close()
    # The segments are timed together, BATCH at a time, in one padded pass of the aligner each.
    for at in range(0, len(servable), BATCH):
        group = servable[at : at + BATCH]
        timed_words = align_segments(
            aligner,
            [log_mel_spectrogram(samples) for _, _, samples in group],
            [str(seg.get("text") or "") for seg, _, _ in group],
            [seg.get("language") or None for seg, _, _ in group],
            [span for _, span, _ in group],
        )
        for (seg, _, _), words in zip(group, timed_words):
            speaker = seg.get("speaker")
            timed[int(seg["id"])] = [{**asdict(w), "speaker": w.speaker or speaker} for w in words]
    return timed, skipped
