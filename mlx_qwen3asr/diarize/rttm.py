"""RTTM lines of speaker turns or of a transcription's segments."""

from __future__ import annotations

import re
from collections.abc import Sequence

from mlx_qwen3asr.diarize.speakers import _finite
from mlx_qwen3asr.diarize.turns import Turn
from mlx_qwen3asr.pipeline.result import Transcription


def _rttm_token(text: str) -> str:
    """A field of an RTTM line: one token, whitespace replaced by underscores."""
    return re.sub(r"\s+", "_", str(text).strip()) or "<NA>"


def rttm_lines(file_id: str, source: Sequence[Turn] | Transcription) -> str:
    """RTTM, one `SPEAKER <file> 1 <start> <duration> <NA> <NA> <speaker> <NA> <NA>` line per turn, or
    per segment with a speaker of a transcription (after assign_speakers), in time order, times in
    seconds to the millisecond. Turns' speakers are written Speaker_1, Speaker_2, ...; a transcription's
    are its labels, with underscores for spaces (an RTTM field is one token). A span that rounds to no
    length (a segment whose words sit at one instant) writes no line."""
    file_id = _rttm_token(file_id)
    if isinstance(source, Transcription):
        spans = [
            (float(s.start), float(s.end), _rttm_token(s.speaker))
            for s in source.segments
            if s.speaker is not None and _finite(s.start) and _finite(s.end)
        ]
    else:
        spans = [(float(t.start), float(t.end), f"Speaker_{int(t.speaker) + 1}") for t in source]
    spans.sort(key=lambda s: (s[0], s[1]))
    lines = []
    for start, end, speaker in spans:
        duration = max(0.0, end - start)
        if f"{duration:.3f}" == "0.000":  # less than a millisecond: no turn (a segment of no length)
            continue
        lines.append(f"SPEAKER {file_id} 1 {start:.3f} {duration:.3f} <NA> <NA> {speaker} <NA> <NA>\n")
    return "".join(lines)
