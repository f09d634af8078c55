"""OpenAI's /v1/audio/transcriptions: the form's options, the answer in each response_format
(json, text, srt, vtt, verbose_json, diarized_json) and the server-sent events of a streamed one."""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import anyio
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.types import Receive, Scope, Send

from mlx_qwen3asr.diarize.speakers import speaker_label
from mlx_qwen3asr.outputs.cues import build_cues
from mlx_qwen3asr.outputs.render import render, segment_json
from mlx_qwen3asr.pipeline.engine import Job
from mlx_qwen3asr.pipeline.result import Segment, Transcription
from mlx_qwen3asr.serve.errors import APIError
from mlx_qwen3asr.serve.uploads import Upload
from mlx_qwen3asr.text.languages import resolve_language
from mlx_qwen3asr.text.output import join_texts

__all__ = [
    "DIARIZED",
    "FORM_REPEATS",
    "GRANULARITIES",
    "RESPONSE_FORMATS",
    "EventStream",
    "TranscriptionRequest",
    "diarized_segments",
    "parse_request",
    "render_response",
    "openai_speaker",
]

RESPONSE_FORMATS = ("json", "text", "srt", "vtt", "verbose_json", "diarized_json")
GRANULARITIES = ("segment", "word")
# The format whose segments name their speaker (OpenAI's, of its diarizing model).
DIARIZED = "diarized_json"
# chunking_strategy: OpenAI's "auto", or server_vad with these settings (accepted; this server's own
# speech detection and cutting decide).
CHUNKING_VAD_FIELDS = {"threshold": float, "prefix_padding_ms": int, "silence_duration_ms": int}
MAX_SPEAKER_NAMES = 100
MAX_SPEAKER_NAME_CHARS = 100
# How often each list field may come in a form (uploads.read_upload); other fields come at most
# uploads.MAX_REPEATS times.
FORM_REPEATS = {
    name: MAX_SPEAKER_NAMES
    for name in (
        "known_speaker_names[]",
        "known_speaker_names",
        "known_speaker_references[]",
        "known_speaker_references",
    )
}
# What decoding does whatever `temperature` asks: greedy (argmax) tokens.
DECODING_TEMPERATURE = 0.0


@dataclass(frozen=True)
class TranscriptionRequest:
    response_format: str
    language: str | None  # canonical name (resolve_language), or None to detect
    context: str
    granularities: frozenset[str]
    stream: bool
    speaker_names: tuple[str, ...] = ()  # known_speaker_names[]: the speakers in order of first appearance

    @property
    def diarize(self) -> bool:
        """The answer names the speakers (diarized_json)."""
        return self.response_format == DIARIZED

    @property
    def word_timestamps(self) -> bool:
        """Words are timed when a format that shows them asks for them (a stream shows text only)."""
        shown = self.response_format in ("verbose_json", "srt", "vtt") and not self.stream
        return shown and "word" in self.granularities


def _flag(value: str | None, name: str) -> bool:
    if value is None:
        return False
    text = value.strip().lower()
    if text in ("true", "1", "yes", "on"):
        return True
    if text in ("false", "0", "no", "off", ""):
        return False
    raise APIError(400, f"{name} must be true or false, got {value!r}", param=name)


def form_language(upload: Upload) -> str | None:
    """The form's language, as its canonical name (None: detect); raises APIError (400) naming it."""
    try:
        return resolve_language(upload.value("language"))
    except ValueError as e:
        raise APIError(400, str(e), param="language", code="unsupported_language") from None


def form_granularities(upload: Upload) -> set[str]:
    """The form's timestamp_granularities[] (segment, word); raises APIError (400) for another."""
    granularities = upload.fields.get("timestamp_granularities[]", []) + upload.fields.get(
        "timestamp_granularities", []
    )
    chosen = {g.strip().lower() for g in granularities if g.strip()}
    unknown = sorted(chosen - set(GRANULARITIES))
    if unknown:
        raise APIError(
            400,
            f"unsupported timestamp granularity {unknown[0]!r}: use segment or word",
            param="timestamp_granularities[]",
        )
    return chosen


def parse_request(upload: Upload) -> TranscriptionRequest:
    """The form's options, checked; raises APIError (400) naming the field at fault."""
    if upload.path is None:
        raise APIError(400, "missing required field 'file' (the audio to transcribe)", param="file")
    if not (upload.value("model") or "").strip():
        raise APIError(400, "missing required field 'model'", param="model")
    fmt = (upload.value("response_format") or "json").strip().lower()
    if fmt not in RESPONSE_FORMATS:
        raise APIError(
            400,
            f"unsupported response_format {fmt!r}: use one of {', '.join(RESPONSE_FORMATS)}",
            param="response_format",
        )
    language = form_language(upload)
    chosen = form_granularities(upload)
    temperature = upload.value("temperature")
    if temperature is not None and temperature.strip():
        try:
            value = float(temperature)
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            raise APIError(400, f"temperature must be a number, got {temperature!r}", param="temperature")
        # Accepted for compatibility; decoding is greedy whatever it says.
    _check_chunking(upload)
    return TranscriptionRequest(
        response_format=fmt,
        language=language,
        context=upload.value("prompt") or "",
        granularities=frozenset(chosen or {"segment"}),
        stream=_flag(upload.value("stream"), "stream"),
        speaker_names=_speaker_names(upload),
    )


def _speaker_names(upload: Upload) -> tuple[str, ...]:
    """known_speaker_names[]: the speakers' names, in the order they first speak. Voices cannot be matched
    to names here, so known_speaker_references[] is refused (400) rather than silently ignored."""
    if any(
        v.strip()
        for k in ("known_speaker_references[]", "known_speaker_references")
        for v in upload.fields.get(k, [])
    ):
        raise APIError(
            400,
            "known_speaker_references[] is not supported: this server does not match voices to names; "
            "known_speaker_names[] alone names the speakers in the order they first speak",
            param="known_speaker_references[]",
            code="unsupported_known_speaker_references",
        )
    names = [
        n.strip() for k in ("known_speaker_names[]", "known_speaker_names") for n in upload.fields.get(k, [])
    ]
    param = "known_speaker_names[]"
    if len(names) > MAX_SPEAKER_NAMES:
        raise APIError(
            400, f"at most {MAX_SPEAKER_NAMES} known_speaker_names[], got {len(names)}", param=param
        )
    for k, name in enumerate(names):
        if not name:
            raise APIError(400, "known_speaker_names[] holds an empty name", param=param)
        if len(name) > MAX_SPEAKER_NAME_CHARS or not name.isprintable():
            raise APIError(
                400,
                f"known_speaker_names[] {k}: a name is at most {MAX_SPEAKER_NAME_CHARS} printable characters",
                param=param,
            )
        if name in names[:k]:
            raise APIError(400, f"known_speaker_names[] names {name!r} twice", param=param)
    return tuple(names)


def _check_chunking(upload: Upload) -> None:
    """chunking_strategy, as OpenAI takes it: "auto", or a server_vad object (as the openai client sends
    it, chunking_strategy[type] and its settings, or as a JSON object). Accepted when well formed: this
    server's speech detection and cutting decide where the audio is cut. A malformed one is a 400."""
    param = "chunking_strategy"
    settings = {
        k[len(param) + 1 : -1]: v
        for k, values in upload.fields.items()
        if k.startswith(param + "[") and k.endswith("]")
        for v in values[:1]
    }
    value = (upload.value(param) or "").strip()
    if value and settings:
        raise APIError(400, "chunking_strategy is given twice", param=param)
    if value.startswith("{"):
        try:
            parsed = json.loads(value)
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            raise APIError(400, 'chunking_strategy must be "auto" or a server_vad object', param=param)
        settings = {str(k): v for k, v in parsed.items()}
    elif value:
        if value.lower() != "auto":
            raise APIError(
                400,
                f'unsupported chunking_strategy {value!r}: use "auto" or a server_vad object',
                param=param,
            )
        return
    if not settings:
        return
    if str(settings.get("type", "")).strip() != "server_vad":
        raise APIError(400, "chunking_strategy[type] must be server_vad", param=f"{param}[type]")
    for key, raw in settings.items():
        if key == "type":
            continue
        kind = CHUNKING_VAD_FIELDS.get(key)
        if kind is None:
            raise APIError(400, f"unknown chunking_strategy field {key!r}", param=f"{param}[{key}]")
        try:
            number = kind(raw) if not isinstance(raw, bool) else None
        except (TypeError, ValueError):
            number = None
        low, high = (0.0, 1.0) if kind is float else (0, 60_000)
        if number is None or not math.isfinite(number) or not low <= number <= high:
            raise APIError(
                400,
                f"chunking_strategy[{key}] must be a number from {low:g} to {high:g}, got {raw!r}",
                param=f"{param}[{key}]",
            )


# --- responses ------------------------------------------------------------------------------------


def _seconds(x: Any) -> float | None:
    """Seconds to the millisecond; None for a time that is not a finite number."""
    return round(float(x), 3) if isinstance(x, (int, float)) and math.isfinite(x) else None


def _compression_ratio(text: str) -> float:
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data)) if data else 0.0


def _segment_json(
    k: int, seg: Segment, doc: dict[str, Any], encode: Callable[[str], list[int]]
) -> dict[str, Any]:
    """One segment in OpenAI's verbose_json shape, from its segment_json doc. Decoding is greedy:
    temperature is 0.0. avg_logprob is the mean log-probability of the text's tokens and no_speech_prob
    the probability of the model answering "language None" (Segment's fields, to 4 significant digits;
    0.0 in place of one that is not finite). truncated and repetitive are ours."""
    return {
        "id": k,
        "seek": int(round(seg.start * 100)),  # 10 ms mel frames, as Whisper counts them
        "start": doc["start"],
        "end": doc["end"],
        "text": doc["text"],
        "tokens": encode(seg.text) if seg.text else [],
        "temperature": DECODING_TEMPERATURE,
        "avg_logprob": doc["avg_logprob"] or 0.0,
        "compression_ratio": _compression_ratio(seg.text),
        "no_speech_prob": doc["no_speech_prob"] or 0.0,
        "truncated": doc["truncated"],
        "repetitive": doc["repetitive"],
    }


def _words_json(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The words of every segment, in OpenAI's shape; those without a finite time are left out."""
    return [
        {"word": w["text"], "start": w["start"], "end": w["end"]}
        for doc in docs
        for w in doc["words"]
        if w["start"] is not None and w["end"] is not None
    ]


def _usage(result: Transcription) -> dict[str, Any]:
    return {"type": "duration", "seconds": _seconds(result.duration) or 0.0}


def openai_speaker(seg: Segment, order: dict[Any, int], names: tuple[str, ...]) -> str:
    """The speaker of a diarized segment as OpenAI labels it: the k-th speaker to speak is named by
    known_speaker_names[k], else by a letter (A, B, ...); order maps each speaker seen so far to k."""
    speaker = getattr(seg, "speaker", None)
    if speaker is None:
        return ""
    return speaker_label(order.setdefault(speaker, len(order)), names, letters=True)


def diarized_segments(result: Transcription, names: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """The segments of diarized_json (and of streamed transcript.text.segment events): id, start, end,
    text and speaker, those without text left out."""
    order: dict[Any, int] = {}
    out = []
    for seg in result.segments:
        if not seg.text.strip():
            continue
        out.append(
            {
                "type": "transcript.text.segment",
                "id": f"seg_{len(out)}",
                "start": _seconds(seg.start) or 0.0,
                "end": _seconds(seg.end) or 0.0,
                "text": seg.text,
                "speaker": openai_speaker(seg, order, names),
            }
        )
    return out


def render_response(
    req: TranscriptionRequest,
    result: Transcription,
    wav: Any,
    encode: Callable[[str], list[int]],
) -> Response:
    """The answer in the requested format (CPU work: cues read the audio; run it off the event loop)."""
    fmt = req.response_format
    if fmt == DIARIZED:
        return JSONResponse(
            {
                "task": "transcribe",
                "duration": _seconds(result.duration) or 0.0,
                "text": result.text,
                "segments": diarized_segments(result, req.speaker_names),
                "usage": _usage(result),
            }
        )
    if fmt == "json":
        return JSONResponse({"text": result.text, "usage": _usage(result)})
    if fmt == "text":
        return PlainTextResponse(result.text + "\n")
    if fmt in ("srt", "vtt"):
        # Segments with aligned words (asked for with timestamp_granularities[]=word) give word cues.
        cues = build_cues(result.segments, wav, duration=result.duration)
        media = "text/vtt" if fmt == "vtt" else "text/plain"
        return Response(render(fmt, result, cues), media_type=f"{media}; charset=utf-8")
    language = (result.language or req.language or "").lower()
    body: dict[str, Any] = {
        "task": "transcribe",
        "language": language,
        "duration": _seconds(result.duration) or 0.0,
        "text": result.text,
    }
    docs = [segment_json(s, round_times=_seconds) for s in result.segments]
    if "segment" in req.granularities:
        body["segments"] = [
            _segment_json(k, s, d, encode) for k, (s, d) in enumerate(zip(result.segments, docs))
        ]
    if "word" in req.granularities:
        body["words"] = _words_json(docs)
    body["usage"] = _usage(result)
    return JSONResponse(body)


class JobHost(Protocol):
    """What an event stream needs of the server: its job's segments, their errors, and the end."""

    def segments(self, job: Job) -> Iterator[Segment]: ...

    async def next_segment(self, segments: Iterator[Segment]) -> Segment | None: ...

    def job_error(self, e: BaseException, upload: Upload) -> APIError: ...

    def finish(self, job: Job | None, upload: Upload, turns: Any = None) -> None: ...

    async def with_speakers(self, request: Any, turns: Any, result: Transcription) -> Transcription: ...


def _event(payload: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n".encode()


class EventStream:
    """Server-sent events for one job: a `transcript.text.delta` per segment's text as it is decoded,
    then, for diarized_json, a `transcript.text.segment` per segment with its speaker once the speakers
    are known (turns), then `transcript.text.done` with the whole text. A client that leaves cancels the
    job and the diarization."""

    def __init__(
        self,
        server: JobHost,
        job: Job,
        upload: Upload,
        req: TranscriptionRequest,
        first: Segment,
        turns: Any = None,  # the request's diarization (a DiarizeJob, from speakers.Speakers.submit)
    ):
        self.server, self.job, self.upload, self.req, self.first = server, job, upload, req, first
        self.turns = turns

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as tasks:

                async def watch() -> None:
                    # The body has been read: what comes now is the client leaving (or, once the last
                    # event is sent, the end of the response). Leaving stops the events; finish() then
                    # cancels the job.
                    while (await receive())["type"] != "http.disconnect":
                        pass
                    tasks.cancel_scope.cancel()

                tasks.start_soon(watch)
                await self._send_events(send)
                tasks.cancel_scope.cancel()
        finally:
            self.server.finish(self.job, self.upload, self.turns)

    async def _send_events(self, send: Send) -> None:
        headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        texts: list[str] = []
        shown = ""
        segments = self.server.segments(self.job)
        seg: Segment | None = self.first
        while seg is not None:
            if seg.text.strip():
                texts.append(seg.text)
                joined = join_texts(texts, self.req.language)
                delta = joined[len(shown) :] if joined.startswith(shown) else seg.text
                shown = joined
                body = _event({"type": "transcript.text.delta", "delta": delta})
                await send({"type": "http.response.body", "body": body, "more_body": True})
            seg = await self.server.next_segment(segments)
        try:
            result = self.job.result(timeout=0)
            if self.turns is not None:
                result = await self.server.with_speakers(None, self.turns, result)
                for segment in diarized_segments(result, self.req.speaker_names):
                    await send({"type": "http.response.body", "body": _event(segment), "more_body": True})
            payload = {"type": "transcript.text.done", "text": result.text}
        except Exception as e:
            error = e if isinstance(e, APIError) else self.server.job_error(e, self.upload)
            payload = {
                "error": {"message": error.message, "type": error.type, "param": None, "code": error.code}
            }
        await send({"type": "http.response.body", "body": _event(payload), "more_body": False})
