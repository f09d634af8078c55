"""Inputs to results. Files: inputs made ready (inputs.py, read ahead: readahead.py), the batching
Scheduler (scheduler.py; its records: tasks.py; the stages it is given: parts.py; rows from the free
memory: memory.py; prompt starts prefilled once: prefixes.py), features for many segments (encoding.py),
results (assembly.py, result.py), word timing (alignment.py), re-timing a given transcript (retime.py),
the Engine the server shares (engine.py), with live streams' steps as rows of its batch (steps.py),
transcribe() and transcribe_stream() (transcribe.py).

Live: the StreamingTranscriber (streaming.py), its window decoded with the encoder's blocks and a draft
kept between steps (window_decode.py), the text a step continues from (rollback.py), where a window is
committed (commits.py, at pauses: pauses.py), the committed text joined as it grows (joined.py), and the
LiveSession that `mlxasr live` and the realtime WebSocket share: feeding, committing, the session's
audio, word timing and the final Transcription (live_session.py)."""
