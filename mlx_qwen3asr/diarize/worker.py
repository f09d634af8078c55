"""The diarizer's worker process: speakrs run in a process of its own, which its parent can kill to stop a
run at once (speakrs itself stops only between its stages).

The parent (mlx_qwen3asr.diarize.process) starts this file as a script, `python worker.py`, so that the
worker imports only the standard library, numpy and speakrs: not mlx, not the mlx_qwen3asr package. The
parent also imports it as a module, for the parts both sides share (the framing, the clustering config for
a threshold, the library's segments as spans); at its top it imports the standard library only.

The protocol, on the worker's stdin and stdout: each message is a frame: a 12-byte header (big-endian: the
JSON part's length in 4 bytes, the binary part's in 8), a JSON object, then raw bytes.

    parent -> worker  {"op": "load", "mode": "CPU", "model_dir": "/path"}
    worker -> parent  {"ok": true} | {"error": "one line"}
    parent -> worker  {"op": "diarize", "threshold": 0.6 | null, "rate": 16000} + the samples (float32,
                      native byte order)
    worker -> parent  {"spans": [[start, end, label], ...], "seconds": compute} | {"error": "one line"}

The worker exits when its stdin closes (its parent closed it, or died), even in the middle of a run; it
ignores Ctrl-C (the terminal's SIGINT is its parent's to handle). What the library prints goes to stderr,
which the worker shares with its parent."""

from __future__ import annotations

import json
import os
import struct
import sys
from typing import Any, BinaryIO

HEADER = struct.Struct(">IQ")


def write_frame(out: BinaryIO, head: dict, data: bytes | memoryview = b"") -> None:
    """Send one frame: head (JSON) and data (raw bytes)."""
    text = json.dumps(head).encode()
    out.write(HEADER.pack(len(text), len(data)) + text)
    if len(data):
        out.write(data)
    out.flush()


def read_exactly(source: BinaryIO, size: int) -> bytes | None:
    """size bytes from source, None at its end (a part read before the end is lost)."""
    parts, left = [], size
    while left:
        chunk = source.read(left)
        if not chunk:
            return None
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def read_frame(source: BinaryIO) -> tuple[dict, bytes] | None:
    """One frame from source: (head, data); None at its end."""
    header = read_exactly(source, HEADER.size)
    if header is None:
        return None
    size, data_size = HEADER.unpack(header)
    text = read_exactly(source, size)
    data = read_exactly(source, data_size) if data_size else b""
    if text is None or data is None:
        return None
    return json.loads(text), data


def threshold_config(speakrs: Any, pipeline: Any, threshold: float | None) -> Any:
    """The pipeline's own config with another AHC threshold (None for its own config as it is)."""
    if threshold is None:
        return None
    base = pipeline.pipeline_config
    clustering = speakrs.ClusteringConfig(
        ahc=speakrs.AhcConfig(float(threshold)),
        vbx=base.clustering.vbx,
        speaker_keep_threshold=base.clustering.speaker_keep_threshold,
    )
    return speakrs.PipelineConfig(
        activity=base.activity,
        clustering=clustering,
        merge_gap=base.merge_gap,
        reconstruct_method=base.reconstruct_method,
        smoothing_epsilon=base.smoothing_epsilon,
    )


def segment_spans(segments: Any, duration: float) -> list[tuple[float, float, str]]:
    """The library's segments as (start, end, label), within the audio (it pads the last window)."""
    spans = []
    for seg in segments:
        start = min(max(float(seg.start), 0.0), duration)
        end = min(max(float(seg.end), 0.0), duration)
        if end > start:
            spans.append((start, end, str(seg.speaker)))
    return spans


def one_line(error: BaseException) -> str:
    """An error in one line, without the library's category tag."""
    message = getattr(error, "message", None) or str(error) or type(error).__name__
    return " ".join(str(message).split())


def _serve(requests: Any, out: BinaryIO) -> None:
    """Answer the parent's requests (from the queue the stdin reader fills) until there are no more."""
    import time

    import numpy as np
    import speakrs

    pipeline = None
    while True:
        message = requests.get()
        if message is None:
            return
        head, data = message
        try:
            if head.get("op") == "load":
                prepared = speakrs.prepare(head["mode"], model_dir=head["model_dir"])
                pipeline = speakrs.Pipeline.from_prepared(prepared)
                write_frame(out, {"ok": True})
            elif head.get("op") == "diarize":
                if pipeline is None:
                    raise RuntimeError("no models loaded")
                samples = np.frombuffer(data, dtype=np.float32)
                config = threshold_config(speakrs, pipeline, head.get("threshold"))
                began = time.perf_counter()
                result = pipeline.diarize_samples(samples, pipeline_config=config)
                took = time.perf_counter() - began
                spans = segment_spans(result.segments, samples.size / float(head.get("rate", 16000)))
                write_frame(out, {"spans": spans, "seconds": took})
            else:
                raise ValueError(f"unknown request {head.get('op')!r}")
        except Exception as e:  # the request fails, the worker goes on
            write_frame(out, {"error": one_line(e)})


def _read_requests(source: BinaryIO, requests: Any) -> None:
    """Pass the frames of stdin on; at its end (the parent closed it, or died) end the process at once,
    whatever the worker is doing."""
    try:
        while True:
            frame = read_frame(source)
            if frame is None:
                break
            requests.put(frame)
    except BaseException:
        pass
    os._exit(0)


def main() -> None:
    import queue
    import signal
    import threading

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # The protocol keeps the real stdout; anything else written to it (by the library) goes to stderr.
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    source = os.fdopen(os.dup(sys.stdin.fileno()), "rb", buffering=0)
    requests: queue.Queue = queue.Queue()
    threading.Thread(target=_read_requests, args=(source, requests), daemon=True).start()
    _serve(requests, out)


if __name__ == "__main__":
    # Run as a script, this folder is first on sys.path: its modules must not shadow anything imported.
    if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
        del sys.path[0]
    main()
