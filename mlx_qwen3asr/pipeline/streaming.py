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

The official prompt is *text* (the rendered template plus the prefix) that vLLM tokenizes as a whole.
Here the same ids are built directly: the template's control tokens and audio placeholders as
``prompt_prefix_ids`` / ``prompt_suffix_ids`` give them, and everything after the assistant's
``<|im_start|>`` (``assistant\\n``, the forced ``language X<asr_text>``, the prefix) encoded as one
text, as the official tokenizer splits the rendered prompt on its added tokens. The generated ids are
decoded with special tokens skipped, as vLLM returns them (``<asr_text>`` is not special and stays).

Bounded cost (``max_window_seconds``): re-encoding from the start makes every step cost more than the
last, without end, so the window (audio since the last commit) is committed and restarted:

* at a pause, early: once the window holds more than half of ``max_window_seconds``, a step whose
  previous decode ended in a pause (each 25 ms of the 200 ms around its end at least 20 dB under the
  window's median energy) commits the audio up to that point with that decode's text. That text is
  already the transcript of the audio before the pause, what the official algorithm gives a stream
  that ends there, so nothing is decoded again; the window restarts at the pause with the chunk just
  added.
* at the bound: when the window passes ``max_window_seconds``, the latest decode that ended in a
  pause is taken the same way. Without one, the cut is the latest pause (200 ms, as above) in the
  window's stable part (the window less its last ``max(1, unfixed_chunks)`` chunks, searched over
  ``COMMIT_SEARCH_SECONDS``), or else its quietest 100 ms (the low-energy rule of ``audio.cutting``),
  and the audio before the cut is decoded once more after the rollback prefix of the last output
  that heard nothing past the cut (a step's worth of new tokens, not the whole head again). When the
  window's latest output begins with what that decode wrote, the rest of it is the new window's text
  so far, and its next decode continues from it less the unstable tokens; otherwise the new window
  starts empty, as a stream would.

A new window counts the whole chunks it starts with, so its second decode continues from its first.
The committed text is not added to the context: the prompt (and every step's cost) stays bounded, and
a window that starts at a pause is the same task as a stream that starts there. Every step encodes at
most ``max(max_window_seconds, COMMIT_SEARCH_SECONDS + unfixed_chunks x chunk_seconds) +
chunk_seconds`` of audio (22 s with the defaults), the same at minute 1 and hour 3. With
``max_window_seconds=None`` nothing is committed before ``finish`` and the steps are the official ones.

Work kept between steps (the default decode; ``reuse_blocks``): the encoder attends within 8 s
windows ("blocks") and its conv stem within 1 s chunks, so the features of complete blocks, and the
prompt's keys and values through their audio tokens, are kept while the block's log-mel frames stay
the same (see :class:`_Blocks`); a step encodes and prefills only the audio after them, the text
after it and the tail of the prompt. Decoding first checks a draft, the tokens the last output had
after the prefix (those the rollback took back), in the same pass as the prompt, and keeps them as
far as greedy decoding would have picked them (``greedy_generate``): the tokens are the same, each
right one saves a decoding step.

Speech detection (``vad``, off by default: the official algorithm decodes everything): Silero scores
the audio as it comes (``audio.vad.SpeechStream``) and only speech reaches the model. Audio with no
speech is dropped undecoded; a window starts where a speech region starts (less ``SPEECH_PAD_SECONDS``)
and takes chunks while the speech is known to go on past them; when the region ends
(``JOIN_GAP_SECONDS`` without speech) the window takes the audio to its end plus the pad, is decoded
once more with the official tail rule (as a stream that ends there) and is committed. Within a region
the window is bounded as above.

Each decode goes through a ``decode`` seam, ``decode(samples, suffix, budget) -> Generation``: the
audio to encode whole, ``suffix(n_audio_tokens)`` the prompt ids after the shared prompt start
(:func:`window_suffix_ids`), and the token budget. By default it encodes and decodes right here, on
the caller's thread; the server gives one that submits the step to its Engine
(``Engine.submit_step``), whose row then decodes in the batch of the file requests.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np

from mlx_qwen3asr.audio.cutting import JOIN_GAP_SECONDS, SPEECH_PAD_SECONDS, quietest_sample
from mlx_qwen3asr.audio.features import HOP_LENGTH, SAMPLE_RATE, log_mel_spectrogram, mel_frame_count
from mlx_qwen3asr.audio.vad import SpeechStream, VadOptions, vad_options
from mlx_qwen3asr.checkpoints.loading import ASRModel
from mlx_qwen3asr.model.encoder import encoder_batch
from mlx_qwen3asr.model.generate import (
    Generation,
    HeaderIds,
    Prefix,
    extend_prefix,
    greedy_generate,
    prefill_prefix,
    token_budget,
)
from mlx_qwen3asr.pipeline.encoding import encode_segments
from mlx_qwen3asr.pipeline.result import Segment
from mlx_qwen3asr.runtime.device import tuning
from mlx_qwen3asr.text.languages import resolve_language
from mlx_qwen3asr.text.output import join_texts, parse_output
from mlx_qwen3asr.text.prompt import PromptIds, prompt_prefix_ids, prompt_suffix_ids

__all__ = [
    "DEFAULT_MAX_WINDOW_SECONDS",
    "StreamUpdate",
    "StreamingTranscriber",
    "rollback_prefix",
    "tail_rollback_prefix",
    "window_suffix_ids",
]

# decode(samples, suffix, budget) -> Generation: one decode of a window (see the module docstring).
Decode = Callable[[np.ndarray, Callable[[int], list[int]], int], Generation]

# Audio since the last commit before one is looked for (None: never, the official behaviour).
DEFAULT_MAX_WINDOW_SECONDS = 20.0
# How far before the stable part's end a cut is looked for, and the shortest audio a commit takes.
COMMIT_SEARCH_SECONDS = 8.0
MIN_COMMIT_SECONDS = 1.0
# Energy window of the quiet-point search (the official low-energy rule uses 100 ms).
QUIET_WINDOW_MS = 100.0
# A decode whose end has the PAUSE_MS around it under PAUSE_ENERGY x the window's median energy (per
# PAUSE_MS) ended in a pause: a commit can take its output as it is.
PAUSE_MS = 200.0
PAUSE_ENERGY = 0.01
PAUSE_STEP_MS = 25.0  # every 25 ms of it: an onset or a word's tail next to silence is no pause
# Prompt starts (keys and values through a kept encoder window) kept per window: the last ones.
KEPT_PREFIXES = 3
# Longest draft a decode checks before decoding (the last output's tokens after the prefix).
MAX_DRAFT_TOKENS = 32

_BROKEN = "\ufffd"


def rollback_prefix(tokenizer, raw: str, unfixed_tokens: int) -> str:
    """The prefix of a chunk step: `raw` re-encoded, less its last `unfixed_tokens` tokens, decoded;
    one more token is dropped while the text holds U+FFFD (a character cut in the middle)."""
    ids = tokenizer.encode(raw)
    k = int(unfixed_tokens)
    while True:
        end = max(0, len(ids) - k)
        prefix = tokenizer.decode(ids[:end], skip_special_tokens=False) if end > 0 else ""
        if _BROKEN not in prefix:
            return prefix
        if end == 0:
            return ""
        k += 1


def tail_rollback_prefix(tokenizer, raw: str, unfixed_tokens: int) -> str:
    """The prefix of the final (tail) step, as the official ``finish_streaming_transcribe`` builds it:
    at least the first token is kept (``max(1, len - unfixed_tokens)``) and a broken character is not
    looked for."""
    ids = tokenizer.encode(raw)
    end = max(1, len(ids) - int(unfixed_tokens))
    return tokenizer.decode(ids[:end], skip_special_tokens=False)


def window_suffix_ids(tokenizer, n_audio_tokens: int, language: str | None, prefix: str) -> list[int]:
    """The prompt ids after the shared prompt start (system prompt and context) of a window decode with
    `n_audio_tokens` audio placeholders, a forced `language` (canonical name, or None) and a text
    `prefix`: what the official tokenizer makes of that part of the rendered prompt + prefix."""
    suffix = prompt_suffix_ids(tokenizer, n_audio_tokens, language)
    if not prefix:
        return suffix
    im_start = tokenizer.token_to_id("<|im_start|>")
    at = len(suffix) - 1 - suffix[::-1].index(im_start)
    assistant = "assistant\n" + (f"language {language}<asr_text>" if language else "")
    return suffix[: at + 1] + tokenizer.encode(assistant + prefix)


_TRAILING = " \t\n.,!?;:\u3002\uff0c\uff01\uff1f\u3001\uff1b\uff1a"


def _header(raw: str) -> str:
    """The ``language X<asr_text>`` header that starts a raw output, or ''."""
    at = raw.find("<asr_text>")
    return raw[: at + len("<asr_text>")] if at >= 0 else ""


def _carried_text(window_raw: str, prefix: str, head_written: str) -> str:
    """What the window wrote for the audio after a commit's cut: its raw output after `prefix` less
    the text the head's decode wrote after the same prefix, when the window's text starts with the
    head's (punctuation and spaces at the head's end aside, as an utterance that stops there ends with
    a full stop). '' when they disagree or nothing is left."""
    if not window_raw.startswith(prefix):
        return ""
    rest = window_raw[len(prefix) :]
    shared = len(os.path.commonprefix([rest, head_written]))
    if head_written[shared:].strip(_TRAILING):
        return ""
    return rest[shared:].lstrip(_TRAILING)


# Log-mel frames (normalized, (log10 + 4) / 4) this close count as the same frames when encoder
# windows are kept: computed again over a longer clip a frame can round differently in its last bits,
# and a louder sound later lifts the floor (8 log10 units under the loudest frame) under the quietest
# bins of earlier frames. A window is encoded again when one of its bins moved by more: 0.01 is 0.4 dB.
SAME_FRAME_TOLERANCE = 0.01


def _same_frames(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and bool(np.max(np.abs(a - b), initial=0.0) <= SAME_FRAME_TOLERANCE)


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


@dataclass
class _Heard:
    """One decode of a window: the window's samples then, its chunk_id and raw output (and flags)."""

    samples: int
    chunk_id: int
    raw: str
    truncated: bool = False
    repetitive: bool = False


@dataclass
class _Window:
    """Audio since the last commit and the official streaming state over it."""

    start: int = 0  # stream sample where the window begins
    audio: np.ndarray = field(default_factory=lambda: np.zeros((0,), dtype=np.float32))
    chunk_id: int = 0
    raw: str = ""
    language: str = ""
    text: str = ""
    truncated: bool = False
    repetitive: bool = False
    # every decode of the window: what the stream had written when it had heard that much
    history: list[_Heard] = field(default_factory=list)


@dataclass
class _Blocks:
    """Encoder output of a window's complete encoder attention windows ("blocks"), and the decoder's
    keys and values of the prompt up to the end of each, for the next decode of audio that starts the
    same way.

    A block's features depend only on its own mel frames (the encoder's chunks and attention windows
    end at block boundaries), so they hold for any audio whose log-mel frames there are the same. The
    frames are compared rather than the samples: a louder sound later in the window raises the
    clip's maximum and with it the floor 8 below it, which changes the quietest bins of earlier
    frames; the blocks from the first one with a bin moved by more than SAME_FRAME_TOLERANCE (0.4 dB)
    on are then encoded again, as the official step encodes everything every time. A kept block is
    thus the official one up to float rounding and such sub-0.4 dB floor moves.
    """

    mel: np.ndarray  # the log-mel frames the blocks were computed from (n_mels, >= blocks x frames)
    features: list[mx.array | None]  # per block, (tokens_per_block, dim) (None: dropped with its prefix)
    prefixes: list[Prefix | None]  # prefixes[k]: the prompt through block k's audio (None: dropped)


class StreamingTranscriber:
    """One live stream: ``feed`` samples as they come, ``finish`` at the end.

    model: a loaded Qwen3-ASR model. language: forced language (any name or code that
    ``resolve_language`` takes) or None to detect it. context: system-prompt context.
    chunk_seconds, unfixed_chunks, unfixed_tokens: the official streaming parameters (defaults 2.0, 2
    and 5). max_new_tokens: tokens each decode may add; None gives ``token_budget`` of the audio decoded
    (the official vLLM wrapper uses a fixed 4096). max_window_seconds: see the module docstring; None
    or inf keeps the whole stream in one window (the official behaviour). tokenizer: the tokenizer of
    the rollback and the prompt (default the model's own). decode: how each window is decoded (see
    the module docstring; default: here, directly). reuse_blocks: with the default decode, keep the
    encoder output and the prompt's keys and values of the window's complete encoder attention windows
    (8 s) between steps instead of computing them again (see :class:`_Blocks`: the same features, up to
    the order of float sums); False computes every step whole, as the official step does. vad: speech
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
        self._quiet_window = max(4, int(QUIET_WINDOW_MS / 1000.0 * SAMPLE_RATE))

        self._eos = PromptIds.from_tokenizer(self.tokenizer).eos
        self._header = HeaderIds.from_tokenizer(self.tokenizer)
        self._start_ids = prompt_prefix_ids(self.tokenizer, self.context)  # checks the context now
        self._start: Prefix | None = None
        self._decode_step: Decode = decode if decode is not None else self._decode_here
        self._local = decode is None
        self.reuse_blocks = bool(reuse_blocks)
        self._blocks: _Blocks | None = None
        self._stems: dict[int, tuple[np.ndarray, mx.array]] = {}  # first frame -> (frames, conv stem)

        self.buffer = np.zeros((0,), dtype=np.float32)
        self.window = _Window()
        self.segments: list[Segment] = []
        self.consumed = 0  # stream samples taken into windows
        self.finished = False
        self.steps = 0  # decodes of the live window
        self.step_encoded_samples: list[int] = []  # samples encoded by each feed/finish step
        self.encoded_samples = 0  # all samples passed to the encoder
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
        """The live window's parsed text (in parity mode: the official ``state.text``)."""
        return self.window.text

    @property
    def window_language(self) -> str:
        """The live window's parsed language (in parity mode: the official ``state.language``)."""
        return self.window.language

    @property
    def chunk_id(self) -> int:
        return self.window.chunk_id

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
            self.window = _Window(start=self.consumed)
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
        gen, prompt = self._decode(w.audio, prefix, self._draft(w.raw, prefix))
        self.last_prompt_ids = prompt
        w.raw = prefix + self.tokenizer.decode(gen.tokens)
        w.language, w.text = parse_output(w.raw, self.language)
        w.truncated, w.repetitive = gen.truncated, gen.repetitive
        w.history.append(_Heard(w.audio.shape[0], w.chunk_id, w.raw, w.truncated, w.repetitive))
        w.chunk_id += 1
        self.steps += 1

    def _commit(self, heard: _Heard | None = None) -> list[Segment]:
        """Commit the window's audio up to a cut as a final segment and restart the window there.

        The cut is the latest point where an earlier decode of the window ended (a chunk boundary)
        that lies in a pause: that decode's output is already the transcript of the audio before it
        (what the official algorithm gives a stream that ends there), so nothing is decoded again.
        Without such a point, the cut is the latest pause in the window's stable part, else its
        quietest 100 ms, and the audio before it is decoded once more (``_head_prefix``)."""
        w = self.window
        heard = heard or self._pause(w)
        if heard is not None:
            cut = heard.samples
            head = _Window(start=w.start, audio=w.audio[:cut], raw=heard.raw)
            head.truncated, head.repetitive = heard.truncated, heard.repetitive
            prefix, written = "", heard.raw
        else:
            right = w.audio.shape[0] - self.margin_samples
            left = max(self.min_commit_samples, right - self.search_samples)
            # The latest pause in the search range leaves the new window the least audio to write
            # again; without one, the quietest 100 ms.
            cut = self._latest_pause(w.audio, left, right)
            if cut is None:
                cut = self._quietest(w.audio, left, right)
            # A cut after the window's first decode (which came after `left` when the window started
            # with carried audio) keeps the head's decode short (_head_prefix): taken when it is
            # about as quiet.
            first = [h.samples for h in w.history if h.chunk_id + 1 >= self.unfixed_chunks]
            if first and left < first[0] and cut < first[0]:
                later = self._quietest(w.audio, first[0], right)
                if self._loudness(w.audio, later) <= 2.0 * self._loudness(w.audio, cut):
                    cut = later
            cut = min(max(cut, 1), w.audio.shape[0] - 1)
            head = _Window(start=w.start, audio=w.audio[:cut])
            prefix = self._head_prefix(w, cut)
            gen, _ = self._decode(head.audio, prefix, self._draft(w.raw, prefix))
            written = self.tokenizer.decode(gen.tokens)
            head.raw = prefix + written
            head.truncated, head.repetitive = gen.truncated, gen.repetitive
        head.language, head.text = parse_output(head.raw, self.language)
        segment = self._segment(head.start, head.start + cut, head)
        self.segments.append(segment)
        rest = w.audio[cut:]
        # The new window already holds whole chunks of audio: it counts them, so its first decode
        # continues from the text the old window wrote after the head's (when there is one).
        new = _Window(start=w.start + cut, audio=rest, chunk_id=rest.shape[0] // self.chunk_samples)
        seed = _carried_text(w.raw, prefix, written)
        if seed:
            new.raw = _header(w.raw) + seed
            new.language, new.text = parse_output(new.raw, self.language)
            # The old window's last decode had not heard the chunk just added.
            before = rest.shape[0] - self.chunk_samples
            if before > 0:
                new.history.append(_Heard(before, new.chunk_id - 1, new.raw))
        self.window = new
        return [segment]

    def _quietest(self, audio: np.ndarray, left: int, right: int) -> int:
        """The quietest sample of the quietest QUIET_WINDOW_MS in [left, right) (right when too short)."""
        if right - left <= self._quiet_window:
            return right
        return left + quietest_sample(audio[left:right], self._quiet_window)

    def _loudness(self, audio: np.ndarray, at: int) -> float:
        """Mean magnitude of the QUIET_WINDOW_MS centred on sample `at`."""
        half = self._quiet_window // 2
        around = audio[max(0, at - half) : at + half]
        return float(np.abs(around, dtype=np.float64).mean()) if around.size else 0.0

    def _pause_floor(self, audio: np.ndarray) -> tuple[np.ndarray, float | None]:
        """Per-sample power and the pause floor: PAUSE_ENERGY x the median energy of the audio's
        PAUSE_MS stretches (None when it is shorter than one)."""
        width = 2 * int(PAUSE_MS / 2000.0 * SAMPLE_RATE)
        power = audio.astype(np.float64) ** 2
        frames = power[: power.shape[0] // width * width].reshape(-1, width).mean(axis=1)
        return power, (PAUSE_ENERGY * float(np.median(frames)) if frames.size else None)

    def _latest_pause(self, audio: np.ndarray, left: int, right: int) -> int | None:
        """The middle of the latest PAUSE_MS in [left, right) whose every PAUSE_STEP_MS is under the
        pause floor, or None."""
        power, floor = self._pause_floor(audio)
        step = max(1, int(PAUSE_STEP_MS / 1000.0 * SAMPLE_RATE))
        need = max(1, int(round(PAUSE_MS / PAUSE_STEP_MS)))
        n = (right - left) // step
        if floor is None or n < need:
            return None
        quiet = power[left : left + n * step].reshape(n, step).mean(axis=1) <= floor
        run = np.convolve(quiet.astype(np.int32), np.ones(need, dtype=np.int32), mode="valid")
        full = np.flatnonzero(run == need)
        if full.size == 0:
            return None
        return left + int(full[-1]) * step + need * step // 2

    def _pause(self, w: _Window, latest: bool = False) -> _Heard | None:
        """The latest decode of the window (at least min_commit_seconds in, before the chunk just
        added) whose end lies in a pause: every PAUSE_STEP_MS of the PAUSE_MS around it holds under
        PAUSE_ENERGY x the median energy of the window's PAUSE_MS stretches. None when there is none.
        latest: only the last decode (the one before the chunk just added) is looked at."""
        half = int(PAUSE_MS / 2000.0 * SAMPLE_RATE)
        last = w.audio.shape[0] - self.chunk_samples
        points = [h for h in w.history if self.min_commit_samples <= h.samples <= last and h.samples >= half]
        if latest:
            points = [h for h in points[-1:] if h.samples == last]
        if not points:
            return None
        power, floor = self._pause_floor(w.audio)
        if floor is None:
            return None
        step = max(1, int(PAUSE_STEP_MS / 1000.0 * SAMPLE_RATE))
        for h in reversed(points):
            around = power[h.samples - half : h.samples + half]
            around = around[: around.size // step * step].reshape(-1, step)
            if around.size and float(around.mean(axis=1).max()) <= floor:
                return h
        return None

    def _head_prefix(self, w: _Window, cut: int) -> str:
        """The prefix of a commit's head decode: the rollback of the last output the window wrote
        having heard no audio past the cut (the prefix its next step took), kept only as far as the
        window's latest output still agrees with it. The head decode thus writes what that step's
        successor would have, had the stream ended at the cut: a chunk or so of tokens rather than
        the whole head again."""
        raw = ""
        for h in w.history:
            if h.samples > cut:
                break
            if h.chunk_id + 1 >= self.unfixed_chunks:
                raw = h.raw
        if not raw:
            return ""
        ids = self.tokenizer.encode(rollback_prefix(self.tokenizer, raw, self.unfixed_tokens))
        now = self.tokenizer.encode(w.raw)
        same = len(os.path.commonprefix([ids, now]))
        return rollback_prefix(
            self.tokenizer, self.tokenizer.decode(ids[:same], skip_special_tokens=False), 0
        )

    def _segment(self, start: int, end: int, w: _Window) -> Segment:
        return Segment(
            start=start / SAMPLE_RATE,
            end=end / SAMPLE_RATE,
            text=w.text,
            language=w.language,
            truncated=w.truncated,
            repetitive=w.repetitive,
        )

    # --- model ------------------------------------------------------------------------------------

    def prompt_ids(self, n_audio_tokens: int, prefix: str) -> list[int]:
        """The whole prompt's ids for `n_audio_tokens` audio placeholders and a text prefix: what the
        official tokenizer makes of the rendered prompt + prefix."""
        return self._start_ids + self._rest_ids(n_audio_tokens, prefix)

    def _rest_ids(self, n_audio_tokens: int, prefix: str) -> list[int]:
        """The prompt after its shared start (system prompt and context)."""
        return window_suffix_ids(self.tokenizer, n_audio_tokens, self.language, prefix)

    def _draft(self, raw: str, prefix: str) -> list[int]:
        """What the decode after `prefix` will likely write: the tokens of the last output `raw` after
        the prefix (the ones the rollback took back), at most MAX_DRAFT_TOKENS; [] when `raw` does not
        start with the prefix's tokens."""
        if not raw:
            return []
        ids = self.tokenizer.encode(raw)
        head = self.tokenizer.encode(prefix) if prefix else []
        if ids[: len(head)] != head:
            return []
        return ids[len(head) : len(head) + MAX_DRAFT_TOKENS]

    def _decode(self, audio: np.ndarray, prefix: str, draft: list[int] = ()) -> tuple[Generation, list[int]]:
        """Encode `audio`, build the prompt with `prefix`, decode greedily (through the decode seam;
        the local decode checks `draft` first, see ``greedy_generate``): (generation, prompt ids)."""
        built: list[list[int]] = []

        def suffix(n_audio_tokens: int) -> list[int]:
            built.append(self._rest_ids(n_audio_tokens, prefix))
            return built[-1]

        budget = self.max_new_tokens
        if budget is None:
            budget = token_budget(audio.shape[0] / SAMPLE_RATE)
        if self._local:  # it counts what it encodes itself
            gen = self._decode_here(audio, suffix, budget, draft)
        else:
            gen = self._decode_step(audio, suffix, budget)
            self.encoded_samples += int(audio.shape[0])
        return gen, self._start_ids + (built[-1] if built else [])

    def _decode_here(
        self, audio: np.ndarray, suffix: Callable[[int], list[int]], budget: int, draft: list[int] = ()
    ) -> Generation:
        """The default decode: encode the window and decode its prompt greedily, on this thread.

        With reuse_blocks, the complete blocks (encoder attention windows) that the last call computed
        for audio that starts the same way are taken as they are (_Blocks): only the audio after them
        is encoded, and the prompt is decoded after the keys and values of the prompt through them.
        """
        net = self.model.net
        if self._start is None:
            self._start = prefill_prefix(net, self._start_ids)
        mel = log_mel_spectrogram(audio)
        cfg = self.model.config.audio_config
        block = cfg.chunk_frames * cfg.chunks_per_window
        # A block is complete when a frame follows it: its last frame's samples are all there.
        complete = max(0, (mel.shape[1] - 1) // block) if self.reuse_blocks else 0
        known = self._blocks_for(mel, complete, block)
        start_frame = len(known.features) * block if known is not None else 0
        self.encoded_samples += max(0, audio.shape[0] - start_frame * HOP_LENGTH)
        new = (
            self._encode_tail(mel, start_frame)
            if self.reuse_blocks
            else encode_segments(self.model, [mel])[0]
        )
        tokens_per_block = cfg.tokens_per_chunk * cfg.chunks_per_window
        have = [] if known is None else known.features
        n_audio = len(have) * tokens_per_block + int(new.shape[0])
        rest = suffix(n_audio)
        audio_id = net.config.audio_token_id
        head = rest.index(audio_id) if n_audio else len(rest)
        if complete:
            blocks = known or _Blocks(mel, [], [])
            blocks.mel = mel
            prefix = blocks.prefixes[-1] if blocks.prefixes else None
            for k in range(len(blocks.features), complete):
                features = new[(k - len(have)) * tokens_per_block : (k - len(have) + 1) * tokens_per_block]
                ids = [audio_id] * tokens_per_block
                if prefix is None:
                    prefix, ids = self._start, rest[:head] + ids
                blocks.features.append(features)
                blocks.prefixes.append(extend_prefix(net, prefix, ids, features))
                prefix = blocks.prefixes[-1]
            # Only the last KEPT_PREFIXES prompt starts are kept (a commit's head needs one a block or
            # two shorter): each holds the keys and values of everything before it.
            for k in range(len(blocks.prefixes) - KEPT_PREFIXES):
                blocks.prefixes[k] = blocks.features[k] = None
            self._blocks = blocks
            taken = complete * tokens_per_block
            tail = new[taken - len(have) * tokens_per_block :]
            return greedy_generate(
                net,
                rest[head + taken :],
                tail,
                budget,
                self._eos,
                prefix=prefix,
                draft=draft,
                header=self._header,
            )
        return greedy_generate(
            net, rest, new, budget, self._eos, prefix=self._start, draft=draft, header=self._header
        )

    def _encode_tail(self, mel: np.ndarray, start_frame: int) -> mx.array:
        """Encoder features of the frames from `start_frame` (a block boundary) on. The conv stem works
        on each 100-frame chunk alone: the stems of complete chunks (a frame follows them) whose frames
        are those of the last call are taken from it."""
        cfg = self.model.config.audio_config
        tower = self.model.net.audio_tower
        tail = mel[:, start_frame:]
        batch = encoder_batch([tail], cfg, self.model.dtype)
        cf = cfg.chunk_frames
        old = self._stems
        stems, fresh = [], []
        for i in range(batch.chunks.shape[0]):
            first = start_frame + i * cf
            frames = mel[:, first : first + cf]
            hit = old.get(first)
            if hit is not None and frames.shape[1] == cf and _same_frames(hit[0], frames):
                stems.append(hit[1])
            else:
                stems.append(None)
                fresh.append(i)
        if fresh:
            step = tuning().stem_chunks
            for k in range(0, len(fresh), step):
                idx = fresh[k : k + step]
                out = tower.embed_chunks(batch.chunks[mx.array(idx, dtype=mx.int32)])
                mx.eval(out)
                for j, i in enumerate(idx):
                    stems[i] = out[j : j + 1]
        keep = {}
        for i, stem in enumerate(stems):
            first = start_frame + i * cf
            if first + cf < mel.shape[1]:  # complete: a frame follows
                keep[first] = (mel[:, first : first + cf].copy(), stem)
        self._stems = keep
        features = tower.encode_embedded(mx.concatenate(stems, axis=0), batch)
        mx.eval(features)
        return features

    def _blocks_for(self, mel: np.ndarray, complete: int, block: int) -> _Blocks | None:
        """The cached blocks that hold for these frames (at most `complete`, up to the first whose
        frames changed), or None."""
        known = self._blocks
        if known is None or not complete:
            return None
        k = 0
        while k < min(len(known.features), complete):
            frames = slice(k * block, (k + 1) * block)
            if not _same_frames(known.mel[:, frames], mel[:, frames]):
                break
            k += 1
        while k > 0 and known.prefixes[k - 1] is None:
            k -= 1
        if k == 0:
            return None
        return _Blocks(known.mel, known.features[:k], known.prefixes[:k])

    # --- updates ----------------------------------------------------------------------------------

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
        earlier = self.segments[: len(self.segments) - (len(committed) if final else 0)]
        text = join_texts([*(s.text for s in earlier), w.text], language or self.language)
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
