"""Live transcription: audio arrives in pieces, the transcript is revised every chunk.

The algorithm is the official streaming one (``Qwen3ASRModel.streaming_transcribe`` and
``finish_streaming_transcribe`` of qwen-asr):

* incoming samples are buffered; each time ``chunk_seconds`` of them are there, the chunk is appended
  to the audio heard so far and *all* of it is encoded again (no padding);
* the prompt is the chat prompt (system context; with a forced language it ends
  ``language X<asr_text>``) followed by a text prefix: nothing for the first ``unfixed_chunks``
  chunks, afterwards the previous step's raw output (``language X<asr_text>...`` included when the
  model wrote it) re-encoded to ids, less its last ``unfixed_tokens`` tokens, decoded back to text,
  with one more token dropped for as long as that text holds a broken character (U+FFFD);
* decoding continues greedily after the prefix; the raw output is prefix + generated text, and is
  parsed into (language, text) like the official ``parse_asr_output``;
* ``finish`` sends the samples still buffered (less than a chunk) with the official tail rule: the
  rollback keeps at least the first token (``max(1, len - unfixed_tokens)``) and has no U+FFFD loop.

The prompt ids, the rollback and the drafts are in ``rollback.py``.

Bounded cost (``max_window_seconds``): the window (audio since the last commit) is committed and
restarted at pauses, or at a cut once it passes the bound, so that every step costs the same at
minute 1 and hour 3 (``commits.py``). With ``max_window_seconds=None`` nothing is committed before
``finish`` and the steps are the official ones.

Work kept between steps (the default decode; ``reuse_blocks``): the encoder's complete 8 s blocks,
their prompt keys and values and a draft of the tokens the rollback took back (``window_decode.py``):
the tokens are the same, each step costs the audio and text that are new.

Speech detection (``vad``, off by default: the official algorithm decodes everything): Silero scores
the audio as it comes (``audio.vad.SpeechStream``) and only speech reaches the model. Audio with no
speech is dropped undecoded; a window starts where a speech region starts (less ``SPEECH_PAD_SECONDS``)
and takes chunks while the speech is known to go on past them; when the region ends
(``JOIN_GAP_SECONDS`` without speech) the window takes the audio to its end plus the pad, is decoded
once more with the official tail rule (as a stream that ends there) and is committed. Within a region
the window is bounded as above.

Where a decode runs: by default here, on the caller's thread (``WindowDecoder.decode``). ``rows``
gives another place for the prepared row (``WindowDecoder.prepare``: encoded with the kept blocks,
prefilled with the draft): the server's ``rows`` submits it to its Engine (``Engine.submit_step``),
whose row then decodes in the batch of the file requests. ``decode(samples, suffix, budget) ->
Generation`` replaces the whole decode (the audio encoded whole, ``suffix(n_audio_tokens)`` the prompt
ids after the shared prompt start, the token budget; nothing is kept between steps).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from mlx_qwen3asr.audio.cutting import JOIN_GAP_SECONDS, SPEECH_PAD_SECONDS
from mlx_qwen3asr.audio.features import SAMPLE_RATE, mel_frame_count
from mlx_qwen3asr.audio.vad import SpeechStream, VadOptions, vad_options
from mlx_qwen3asr.checkpoints.loading import ASRModel
from mlx_qwen3asr.model.draft import DraftStart
from mlx_qwen3asr.model.generate import Generation, HeaderIds, token_budget
from mlx_qwen3asr.pipeline.commits import Commits, Heard, Window
from mlx_qwen3asr.pipeline.joined import JoinedTexts
from mlx_qwen3asr.pipeline.result import Segment
from mlx_qwen3asr.pipeline.rollback import (
    draft_ids,
    rollback_prefix,
    tail_rollback_prefix,
    window_suffix_ids,
)
from mlx_qwen3asr.pipeline.window_decode import WindowDecoder
from mlx_qwen3asr.text.languages import resolve_language
from mlx_qwen3asr.text.output import join_texts, parse_output
from mlx_qwen3asr.text.prompt import PromptIds, prompt_prefix_ids

__all__ = [
    "DEFAULT_MAX_WINDOW_SECONDS",
    "Decode",
    "RowDecode",
    "StreamUpdate",
    "StreamingTranscriber",
    "rollback_prefix",
    "tail_rollback_prefix",
    "window_suffix_ids",
]

# decode(samples, suffix, budget) -> Generation: a whole decode of a window (see the module docstring).
Decode = Callable[[np.ndarray, Callable[[int], list[int]], int], Generation]
# rows(samples, suffix, budget, prepare) -> Generation: where a prepared decode runs on; prepare()
# encodes and prefills it (see the module docstring).
RowDecode = Callable[[np.ndarray, Callable[[int], list[int]], int, Callable[[], DraftStart]], Generation]

# Audio since the last commit before one is looked for (None: never, the official behaviour).
DEFAULT_MAX_WINDOW_SECONDS = 20.0
# How far before the stable part's end a cut is looked for, and the shortest audio a commit takes.
COMMIT_SEARCH_SECONDS = 8.0
MIN_COMMIT_SECONDS = 1.0


def _has_frames(audio: np.ndarray) -> bool:
    """Whether the audio holds a log-mel frame to encode: under 10 ms (one hop) it holds none, and is
    an empty transcript, as silence is, rather than a decode."""
    return mel_frame_count(audio.shape[0]) > 0


def _as_samples(samples) -> np.ndarray:
    """Mono float32 samples as the official step takes them: flattened; int16 scaled by 1/32768."""
    if samples is None:
        raise ValueError("samples must not be None")
    x = np.asarray(samples)
    if x.ndim != 1:
        x = x.reshape(-1)
    if x.dtype == np.int16:
        return x.astype(np.float32) / 32768.0
    return x.astype(np.float32, copy=False)


@dataclass
class StreamUpdate:
    """The transcript after one step.

    text: everything so far, the committed segments then the live window (``stable + unstable``).
    stable: the part later steps keep: committed text and the window's text up to the next step's
    prefix. unstable: the tail made by the tokens the next step rolls back (all of the window's text
    while the window has fewer than ``unfixed_chunks`` chunks); empty in the final update.
    committed: segments committed by this step. seconds: stream time of the audio consumed so far.
    encoded_samples: samples this step passed to the encoder.
    """

    language: str
    text: str
    stable: str
    unstable: str
    committed: list[Segment] = field(default_factory=list)
    final: bool = False
    seconds: float = 0.0
    encoded_samples: int = 0


class StreamingTranscriber(Commits):
    """One live stream: ``feed`` samples as they come, ``finish`` at the end.

    model: a loaded Qwen3-ASR model. language: forced language (any name or code that
    ``resolve_language`` takes) or None to detect it. context: system-prompt context.
    chunk_seconds, unfixed_chunks, unfixed_tokens: the official streaming parameters (defaults 2.0, 2
    and 5). max_new_tokens: tokens each decode may add; None gives ``token_budget`` of the audio decoded
    (the official vLLM wrapper uses a fixed 4096). max_window_seconds: see the module docstring; None
    or inf keeps the whole stream in one window (the official behaviour). tokenizer: the tokenizer of
    the rollback and the prompt (default the model's own). decode: how each window is decoded (see
    the module docstring; default: here, directly). rows: where a prepared decode runs on (see the
    module docstring; default: here). reuse_blocks: keep the encoder output and the prompt's keys and
    values of the window's complete encoder attention windows (8 s) between steps instead of computing
    them again (``window_decode.Blocks``: the same features, up to the order of float sums); False
    computes every step whole, as the official step does. vad: speech
    detection (True, a VadOptions, or None/False: off), see the module docstring; ``speech`` then lists
    the speech regions taken, in seconds.

    Decoding stops at EOS, at the budget, or, unlike vLLM, when the output runs into a loop of at least
    20 repetitions (``model.generate``).
    """

    def __init__(
        self,
        model: ASRModel,
        *,
        language: str | None = None,
        context: str = "",
        chunk_seconds: float = 2.0,
        unfixed_chunks: int = 2,
        unfixed_tokens: int = 5,
        max_new_tokens: int | None = None,
        max_window_seconds: float | None = DEFAULT_MAX_WINDOW_SECONDS,
        commit_search_seconds: float = COMMIT_SEARCH_SECONDS,
        min_commit_seconds: float = MIN_COMMIT_SECONDS,
        tokenizer=None,
        decode: Decode | None = None,
        rows: RowDecode | None = None,
        reuse_blocks: bool = True,
        vad: bool | VadOptions | None = None,
    ) -> None:
        if chunk_seconds is None or not float(chunk_seconds) > 0:
            raise ValueError(f"chunk_seconds must be > 0, got: {chunk_seconds}")
        if max_new_tokens is not None and int(max_new_tokens) < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        self.model = model
        self.tokenizer = tokenizer if tokenizer is not None else model.tokenizer
        self.language = resolve_language(language)
        self.context = context or ""
        self.chunk_seconds = float(chunk_seconds)
        self.chunk_samples = max(1, int(round(self.chunk_seconds * SAMPLE_RATE)))
        self.unfixed_chunks = int(unfixed_chunks)
        self.unfixed_tokens = int(unfixed_tokens)
        self.max_new_tokens = None if max_new_tokens is None else int(max_new_tokens)

        self.max_window_samples: int | None = None
        if max_window_seconds is not None and math.isfinite(float(max_window_seconds)):
            self.margin_samples = max(1, self.unfixed_chunks) * self.chunk_samples
            self.min_commit_samples = max(1, int(round(float(min_commit_seconds) * SAMPLE_RATE)))
            self.search_samples = max(0, int(round(float(commit_search_seconds) * SAMPLE_RATE)))
            self.max_window_samples = int(round(float(max_window_seconds) * SAMPLE_RATE))
            if self.max_window_samples < self.margin_samples + self.min_commit_samples:
                raise ValueError(
                    f"max_window_seconds={max_window_seconds} leaves no stable audio to commit: it must be at "
                    f"least {(self.margin_samples + self.min_commit_samples) / SAMPLE_RATE:g} s "
                    f"(max(1, unfixed_chunks) chunks plus min_commit_seconds)"
                )
        self._eos = PromptIds.from_tokenizer(self.tokenizer).eos
        self._header = HeaderIds.from_tokenizer(self.tokenizer)
        self._start_ids = prompt_prefix_ids(self.tokenizer, self.context)  # checks the context now
        self._decode_step = decode
        self._rows = rows
        self.windows = WindowDecoder(model, self._start_ids, self._header, reuse_blocks)
        self._given_encoded = 0  # samples the given decode encoded
        self._joined = JoinedTexts()

        self.buffer = np.zeros((0,), dtype=np.float32)
        self.window = Window()
        self.segments: list[Segment] = []
        self.consumed = 0  # stream samples taken into windows
        self.finished = False
        self.steps = 0  # decodes of the live window
        self.step_encoded_samples: list[int] = []  # samples encoded by each feed/finish step
        self.last_prompt_ids: list[int] = []  # ids of the last window decode's whole prompt
        self._last_update: StreamUpdate | None = None
        # Speech detection (vad): only speech reaches the model, and a window is committed where its
        # speech ends (see _speech_steps).
        options = vad_options(vad)
        self._speech = SpeechStream(options, JOIN_GAP_SECONDS) if options is not None else None
        self._speech_pad = int(round(SPEECH_PAD_SECONDS * SAMPLE_RATE))
        self.speech: list[tuple[float, float]] = []  # with vad: the speech regions taken, in seconds

    # --- the official state, read-only views -------------------------------------------------------

    @property
    def text(self) -> str:
        """The live window's parsed text (with max_window_seconds=None, the official streaming
        behaviour: the official ``state.text``)."""
        return self.window.text

    @property
    def window_language(self) -> str:
        """The live window's parsed language (with max_window_seconds=None, the official streaming
        behaviour: the official ``state.language``)."""
        return self.window.language

    @property
    def chunk_id(self) -> int:
        return self.window.chunk_id

    @property
    def encoded_samples(self) -> int:
        """All samples passed to the encoder."""
        return self._given_encoded + self.windows.encoded_samples

    # --- steps -----------------------------------------------------------------------------------

    def feed(self, samples) -> list[StreamUpdate]:
        """Buffer 16 kHz mono samples (float, or int16 scaled by 1/32768); one update per full chunk
        consumed (none while less than a chunk is buffered)."""
        if self.finished:
            raise RuntimeError("the stream is finished")
        x = _as_samples(samples)
        if x.shape[0] > 0:
            self.buffer = np.concatenate([self.buffer, x], axis=0)
        if self._speech is not None:
            self._speech.feed(x)
            return self._speech_steps()
        updates = []
        while self.buffer.shape[0] >= self.chunk_samples:
            chunk = self.buffer[: self.chunk_samples]
            self.buffer = self.buffer[self.chunk_samples :]
            updates.append(self._chunk_step(chunk))
        return updates

    def finish(self) -> StreamUpdate:
        """Decode the buffered tail (shorter than a chunk) with the official tail rule, commit the
        window as the last segment and return the final update. Nothing buffered: no decode, the window
        as the last step left it is committed. A stream of under 10 ms in all (no log-mel frame) is
        not decoded and commits nothing: an empty transcript. A second call returns the final update
        again, with no new segments."""
        if self.finished:
            last = self._last_update
            return StreamUpdate(
                last.language, last.text, last.stable, last.unstable, [], True, last.seconds, 0
            )
        self.finished = True
        encoded_before = self.encoded_samples
        after = self._speech_end() if self._speech is not None else 0
        tail, self.buffer = self.buffer, np.zeros((0,), dtype=np.float32)
        committed = self._close_window(tail)
        self.consumed += after
        update = self._update(committed, final=True, encoded=self.encoded_samples - encoded_before)
        self.step_encoded_samples.append(update.encoded_samples)
        self._last_update = update
        return update

    def _close_window(self, tail: np.ndarray) -> list[Segment]:
        """Append `tail` (shorter than a chunk) to the window, decode the window with the official tail
        rule (not when nothing was added, nor when the window holds no log-mel frame) and commit it:
        the committed segment, or [] for a window with no audio to decode and no text."""
        w = self.window
        if tail.shape[0] > 0:
            self._append(tail)
            if _has_frames(w.audio):
                prefix = (
                    ""
                    if w.chunk_id < self.unfixed_chunks
                    else tail_rollback_prefix(self.tokenizer, w.raw, self.unfixed_tokens)
                )
                self._decode_window(prefix)
        committed = []
        if _has_frames(w.audio) or w.text:
            committed.append(self._segment(w.start, w.start + w.audio.shape[0], w))
            self.segments.extend(committed)
        return committed

    def _append(self, samples: np.ndarray) -> None:
        w = self.window
        w.audio = samples if w.audio.shape[0] == 0 else np.concatenate([w.audio, samples], axis=0)
        self.consumed += samples.shape[0]

    # --- speech detection ------------------------------------------------------------------------
    #
    # With vad, the buffer is taken by the speech regions the detector finds (SpeechStream): audio that
    # holds none is dropped undecoded (SPEECH_PAD_SECONDS before a region are kept), a window starts
    # where a region starts (less the pad) and takes chunks as long as the speech is known to go on
    # past them, and where the region ends (JOIN_GAP_SECONDS without speech) the window takes the
    # audio to that end plus the pad, is decoded once more with the official tail rule, as a stream
    # that ends there, and is committed. Within a region the windows are bounded as without vad.

    def _skip(self, to: int) -> None:
        """Drop the buffered audio before stream sample `to`, undecoded (the window is empty)."""
        n = min(max(0, to - self.consumed), self.buffer.shape[0])
        if n:
            self.buffer = self.buffer[n:]
            self.consumed += n
        self.window.start = self.consumed

    def _speech_steps(self) -> list[StreamUpdate]:
        """The steps the buffered audio allows with speech detection (see above)."""
        speech, pad = self._speech, self._speech_pad
        updates = []
        while True:
            ended = bool(speech.regions)
            region = speech.regions[0] if ended else speech.current
            if region is None:
                if self.window.audio.shape[0] == 0:  # no speech under way: what came before is none
                    start = speech.pending_start
                    self._skip((speech.scored if start is None else start) - pad)
                return updates
            if self.window.audio.shape[0] == 0:
                self._skip(region.start - pad)
            reach = region.end + pad if ended else region.end  # where the speech is known to go
            if self.consumed + self.chunk_samples <= min(reach, self.consumed + self.buffer.shape[0]):
                chunk = self.buffer[: self.chunk_samples]
                self.buffer = self.buffer[self.chunk_samples :]
                updates.append(self._chunk_step(chunk))
                continue
            if not ended:
                return updates
            speech.regions.pop(0)
            self.speech.append((region.start / SAMPLE_RATE, region.end / SAMPLE_RATE))
            encoded_before = self.encoded_samples
            n = min(max(0, reach - self.consumed), self.buffer.shape[0])
            tail, self.buffer = self.buffer[:n], self.buffer[n:]
            committed = self._close_window(tail)
            self.window = Window(start=self.consumed)
            update = self._update(committed, final=False, encoded=self.encoded_samples - encoded_before)
            self.step_encoded_samples.append(update.encoded_samples)
            self._last_update = update
            updates.append(update)

    def _speech_end(self) -> int:
        """At finish with speech detection: keep in the buffer only the speech under way (to its last
        speech window plus the pad); returns the samples after it, which are never decoded."""
        speech = self._speech
        region = speech.current
        if region is None and self.window.audio.shape[0] > 0:  # (not reached: a window is speech)
            return 0
        if region is None:
            keep = 0
        else:
            self.speech.append((region.start / SAMPLE_RATE, region.end / SAMPLE_RATE))
            if self.window.audio.shape[0] == 0:
                self._skip(region.start - self._speech_pad)
            keep = min(max(0, region.end + self._speech_pad - self.consumed), self.buffer.shape[0])
        after = self.buffer.shape[0] - keep
        self.buffer = self.buffer[:keep]
        return after

    def _chunk_step(self, chunk: np.ndarray) -> StreamUpdate:
        encoded_before = self.encoded_samples
        self._append(chunk)
        committed = []
        if self.max_window_samples is not None:
            n = self.window.audio.shape[0]
            if n > self.max_window_samples:
                committed = self._commit()
            elif n - self.chunk_samples >= self.max_window_samples // 2:
                # Past half the bound, a pause where the last decode ended is committed at once.
                heard = self._pause(self.window, latest=True)
                if heard is not None:
                    committed = self._commit(heard)
        w = self.window
        prefix = (
            ""
            if w.chunk_id < self.unfixed_chunks
            else rollback_prefix(self.tokenizer, w.raw, self.unfixed_tokens)
        )
        self._decode_window(prefix)
        update = self._update(committed, final=False, encoded=self.encoded_samples - encoded_before)
        self.step_encoded_samples.append(update.encoded_samples)
        self._last_update = update
        return update

    def _decode_window(self, prefix: str) -> None:
        """One official decode of the whole window after `prefix`; updates the window's state."""
        w = self.window
        gen, prompt = self._decode(w.audio, prefix, draft_ids(self.tokenizer, w.raw, prefix))
        self.last_prompt_ids = prompt
        w.raw = prefix + self.tokenizer.decode(gen.tokens)
        w.language, w.text = parse_output(w.raw, self.language)
        w.truncated, w.repetitive = gen.truncated, gen.repetitive
        w.history.append(Heard(w.audio.shape[0], w.chunk_id, w.raw, w.truncated, w.repetitive))
        w.chunk_id += 1
        self.steps += 1

    # --- model ------------------------------------------------------------------------------------

    def prompt_ids(self, n_audio_tokens: int, prefix: str) -> list[int]:
        """The whole prompt's ids for `n_audio_tokens` audio placeholders and a text prefix: what the
        official tokenizer makes of the rendered prompt + prefix."""
        return self._start_ids + self._rest_ids(n_audio_tokens, prefix)

    def _rest_ids(self, n_audio_tokens: int, prefix: str) -> list[int]:
        """The prompt after its shared start (system prompt and context)."""
        return window_suffix_ids(self.tokenizer, n_audio_tokens, self.language, prefix)

    def _decode(self, audio: np.ndarray, prefix: str, draft: list[int] = ()) -> tuple[Generation, list[int]]:
        """Encode `audio`, build the prompt with `prefix`, decode greedily, checking `draft` first
        (through the seams, see the module docstring): (generation, prompt ids)."""
        built: list[list[int]] = []

        def suffix(n_audio_tokens: int) -> list[int]:
            built.append(self._rest_ids(n_audio_tokens, prefix))
            return built[-1]

        budget = self.max_new_tokens
        if budget is None:
            budget = token_budget(audio.shape[0] / SAMPLE_RATE)
        eos = self._eos
        if self._decode_step is not None:
            gen = self._decode_step(audio, suffix, budget)
            self._given_encoded += int(audio.shape[0])
        elif self._rows is not None:

            def prepare() -> DraftStart:
                return self.windows.prepare(audio, suffix, budget, draft, eos)[0]

            gen = self._rows(audio, suffix, budget, prepare)
        else:
            gen = self.windows.decode(audio, suffix, budget, draft, eos)
        return gen, self._start_ids + (built[-1] if built else [])

    # --- updates ----------------------------------------------------------------------------------

    def committed_text(self, language: str | None = None, count: int | None = None) -> str:
        """The texts of the first `count` committed segments (all when None) joined as join_texts joins
        them for `language` (default: the stream's), kept as they grow rather than joined again."""
        return self._joined.text(self.segments, language or self.language, count)

    def _update(self, committed: list[Segment], *, final: bool, encoded: int) -> StreamUpdate:
        w = self.window
        if final:
            stable_window = w.text
        elif w.chunk_id < self.unfixed_chunks:
            stable_window = ""
        else:
            stable_raw = rollback_prefix(self.tokenizer, w.raw, self.unfixed_tokens)
            stable_window = parse_output(stable_raw, self.language)[1] if stable_raw else ""
            stable_window = os.path.commonprefix([stable_window, w.text])
        unstable = w.text[len(stable_window) :]
        language = w.language
        if not language and not w.text:
            language = next((s.language for s in reversed(self.segments) if s.language), "")
        # Segments committed at finish carry the window itself: join only the earlier ones.
        earlier = len(self.segments) - (len(committed) if final else 0)
        text = join_texts([self.committed_text(language, earlier), w.text], language or self.language)
        stable = text[: len(text) - len(unstable)]
        return StreamUpdate(
            language=language,
            text=text,
            stable=stable,
            unstable=unstable,
            committed=committed,
            final=final,
            seconds=self.consumed / SAMPLE_RATE,
            encoded_samples=encoded,
        )
