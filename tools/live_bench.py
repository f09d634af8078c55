"""Live transcription timed as if the audio were played at real time (tools/bench.py --mode live).

The stream is fed one chunk (chunk_seconds of samples) at a time and every step (``feed`` of one
chunk, and ``finish``) is timed on the wall clock. The playback is a virtual clock rather than
sleeping: chunk k's last sample arrives at a_k = (k + 1) x chunk_seconds of stream time (the last
step's at the end of the audio), its step starts at max(a_k, end of the previous step) and lasts its
measured wall time. A stream that is processed faster than real time therefore takes less time to
measure than to play, and one that is slower falls behind exactly as it would live: every later
step starts later and its latency grows.

Random weights write gibberish, so words cannot be followed through the transcript. Proxies:

* partial latency of chunk k: the end of the step that was given chunk k minus a_k. That step's
  output is the first partial whose text covers chunk k's audio (the tokens it adds are attributed to
  chunk k); one value per chunk.
* commit latency of chunk k: the end of the first step after which all of chunk k's audio lies
  before the committed boundary (the start of the live window), minus a_k. Only commits made while
  the stream runs count; the chunks of the last window are committed by ``finish`` when the stream
  ends and are counted apart. With an unbounded window nothing is committed before the end.
* compute per audio second: the steps' total wall time / the audio's seconds; below 1.0 the stream
  keeps up with real time.
* cost per step by minute: the median wall time and samples encoded of the steps whose chunk
  arrives in each minute of the stream.

Random weights rarely stop on their own, so EOS and the loop stop are off and every decode writes a
budget that mimics speech: ``tokens_per_second`` x the seconds of audio decoded, less the tokens
of the text prefix it is given (what speech at that rate would already have written), at least 1.
A step with the rollback prefix thus writes about tokens_per_second x chunk_seconds + unfixed_tokens
tokens.

Random weights also pick tokens from the whole vocabulary, most of them pieces of multi-byte
characters: their text is full of broken characters (U+FFFD), and the official rollback drops a token
more for as long as the prefix holds one, so nearly every prefix would fall back to empty and every
step would decode the whole window, which speech never does. The stream is therefore run on a copy of
the checkpoint whose embedding rows (the LM head's too, tied or not) are zero except for words (a
space and lowercase letters), the special tokens and the prompt's tokens (``wordy_checkpoint``): its
logits are 0 for every other token and it writes words. Every system is given the same copy.

The peer (moona3k's mlx-qwen3-asr, ``init_streaming`` / ``feed_audio`` / ``finish_streaming``) is
run by ``python tools/live_bench.py --peer moona3k ...`` in its own environment with the same
audio, checkpoint, chunk size, window bound (its ``max_context_sec``), forced language and budget
rule; its EOS and repetition stops are switched off the same way.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
SAMPLE_RATE = 16000


@dataclass
class Step:
    audio_end_s: float  # stream time of the last sample the step was given (its chunk's arrival)
    wall_s: float  # measured wall time of the step
    encoded_samples: int  # samples passed to the encoder by the step
    window_samples: int  # samples of the live window after the step
    committed_until_s: float  # stream time before which everything is committed after the step
    tokens: int  # tokens decoded by the step
    final: bool = False
    drafted: int = 0  # of them, taken from drafts (checked in one pass with the prompt)


def wordy_checkpoint(src: Path, dst: Path, keep: set[int] = frozenset()) -> Path:
    """A copy of the checkpoint at `src` in `dst` that writes words (see the module docstring): rows of
    the embedding and LM head matrices are zeroed except for tokens that are a space and lowercase
    letters, the added (special) tokens and `keep`. Float checkpoints only."""
    import re
    import shutil

    import mlx.core as mx

    from mlx_qwen3asr.checkpoints.tokenizer import Tokenizer

    src, dst = Path(src), Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer.from_dir(src)
    word = re.compile("^\u0120[a-z]{2,}$")  # byte-level BPE writes the space as U+0120
    vocab = tok.backend.get_vocab(with_added_tokens=True)
    first_added = (
        min(i for t, i in vocab.items() if t.startswith("<|"))
        if any(t.startswith("<|") for t in vocab)
        else len(vocab)
    )
    keep_ids = {i for t, i in vocab.items() if word.match(t) or i >= first_added} | {int(i) for i in keep}
    for path in src.iterdir():
        if path.suffix != ".safetensors" and path.is_file():
            shutil.copy2(path, dst / path.name)
    for path in sorted(src.glob("*.safetensors")):
        weights, metadata = mx.load(str(path), return_metadata=True)
        for name, w in weights.items():
            if name.endswith(("embed_tokens.weight", "lm_head.weight")):
                if w.dtype not in (mx.float32, mx.float16, mx.bfloat16):
                    raise ValueError(f"{src}: {name} is {w.dtype}; wordy_checkpoint takes float checkpoints")
                rows = np.zeros((w.shape[0], 1), dtype=bool)
                rows[[i for i in keep_ids if i < w.shape[0]]] = True
                weights[name] = mx.where(mx.array(rows), w, mx.zeros_like(w))
        mx.save_safetensors(str(dst / path.name), weights, metadata=metadata)
    return dst


def prompt_tokens(model, language: str | None, context: str = "") -> set[int]:
    """Every token of the live prompt (both forms of its assistant turn)."""
    from mlx_qwen3asr.pipeline.streaming import StreamingTranscriber

    stream = StreamingTranscriber(model, language=language, context=context)
    ids = set(stream.prompt_ids(3, "")) | set(stream.prompt_ids(3, "language English<asr_text>hello"))
    return ids


def decode_budget(tokens_per_second: float, seconds: float, prefix_tokens: int) -> int:
    """Tokens one decode writes: speech's tokens for the audio, less those its prefix already holds."""
    return max(1, round(tokens_per_second * seconds) - prefix_tokens)


# --------------------------------------------------------------------------------------------------
# Figures from the steps


def clock(steps: list[Step]) -> list[tuple[float, float]]:
    """(start, end) of every step on the virtual real-time clock."""
    out, free = [], 0.0
    for s in steps:
        start = max(s.audio_end_s, free)
        free = start + s.wall_s
        out.append((start, free))
    return out


def spread(xs: list[float]) -> dict:
    if not xs:
        return {"n": 0, "p50": None, "p95": None, "max": None}
    a = np.asarray(xs, dtype=np.float64)
    return {
        "n": len(xs),
        "p50": float(np.percentile(a, 50)),
        "p95": float(np.percentile(a, 95)),
        "max": float(a.max()),
    }


def summarize(steps: list[Step], chunk_seconds: float) -> dict:
    times = clock(steps)
    audio_s = steps[-1].audio_end_s
    chunks = [i for i, s in enumerate(steps) if not s.final or s.encoded_samples > 0]
    partial = [times[i][1] - steps[i].audio_end_s for i in chunks]
    committed, at_end, j = [], 0, 0
    for i in chunks:
        end = steps[i].audio_end_s
        while j < len(steps) and steps[j].committed_until_s < end - 0.5 / SAMPLE_RATE:
            j += 1
        if j >= len(steps) or steps[j].final:
            at_end += 1
        else:
            committed.append(times[j][1] - end)
    minutes: dict[int, list[Step]] = {}
    for s in steps:
        if not s.final:
            minutes.setdefault(max(1, math.ceil(s.audio_end_s / 60.0 - 1e-9)), []).append(s)
    wall = sum(s.wall_s for s in steps)
    return {
        "audio_s": audio_s,
        "chunk_seconds": chunk_seconds,
        "steps": len(steps),
        "compute_s": wall,
        "compute_per_audio_s": wall / audio_s,
        "lag_at_end_s": times[-1][1] - audio_s,
        "partial_latency_s": spread(partial),
        "commit_latency_s": spread(committed),
        "chunks_committed_at_end": at_end,
        "commits_before_end": sum(
            1 for a, b in zip(steps, steps[1:]) if not b.final and b.committed_until_s > a.committed_until_s
        )
        + int(steps[0].committed_until_s > 0 and not steps[0].final),
        "tokens": sum(s.tokens for s in steps),
        "drafted_tokens": sum(s.drafted for s in steps),
        "max_encoded_s": max(s.encoded_samples for s in steps) / SAMPLE_RATE,
        "per_minute": {
            str(m): {
                "steps": len(ss),
                "median_step_s": statistics.median(s.wall_s for s in ss),
                "median_encoded_s": statistics.median(s.encoded_samples for s in ss) / SAMPLE_RATE,
                "max_encoded_s": max(s.encoded_samples for s in ss) / SAMPLE_RATE,
            }
            for m, ss in sorted(minutes.items())
        },
    }


# --------------------------------------------------------------------------------------------------
# Ours: mlx_qwen3asr.pipeline.streaming.StreamingTranscriber


def run_ours(
    model,
    audio: np.ndarray,
    *,
    chunk_seconds: float,
    max_window_seconds: float | None,
    tokens_per_second: float,
    language: str | None,
    context: str = "",
) -> list[Step]:
    """One stream fed chunk by chunk, each step timed. Call it with the loop stop off (bench.no_loop_stop)."""
    from mlx_qwen3asr.pipeline.streaming import StreamingTranscriber

    class Budgeted(StreamingTranscriber):
        """EOS off; each decode writes decode_budget() tokens."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._eos = frozenset()
            self.tokens = self.drafted = 0

        def _decode(self, audio, prefix, draft=()):
            given = len(self.tokenizer.encode(prefix)) if prefix else 0
            self.max_new_tokens = decode_budget(tokens_per_second, audio.shape[0] / SAMPLE_RATE, given)
            gen, prompt = super()._decode(audio, prefix, draft)
            self.tokens += len(gen.tokens)
            self.drafted += gen.drafted
            return gen, prompt

    stream = Budgeted(
        model,
        language=language,
        context=context,
        chunk_seconds=chunk_seconds,
        max_window_seconds=max_window_seconds,
    )
    n = stream.chunk_samples
    steps: list[Step] = []

    def record(wall: float, update, final: bool) -> None:
        w = stream.window
        until = update.seconds if final else w.start / SAMPLE_RATE
        tokens, stream.tokens = stream.tokens, 0
        drafted, stream.drafted = stream.drafted, 0
        steps.append(
            Step(
                update.seconds, wall, update.encoded_samples, w.audio.shape[0], until, tokens, final, drafted
            )
        )

    pos = 0
    while audio.shape[0] - pos >= n:
        start = time.perf_counter()
        updates = stream.feed(audio[pos : pos + n])
        wall = time.perf_counter() - start
        pos += n
        assert len(updates) == 1
        record(wall, updates[0], final=False)
    start = time.perf_counter()
    stream.feed(audio[pos:])
    update = stream.finish()
    record(time.perf_counter() - start, update, final=True)
    return steps


# --------------------------------------------------------------------------------------------------
# moona3k's mlx-qwen3-asr (run in the peers' environment)


def run_moona3k(
    model_dir: Path,
    audio: np.ndarray,
    *,
    chunk_seconds: float,
    max_window_seconds: float,
    tokens_per_second: float,
    language: str | None,
    warmup_chunks: int = 3,
) -> tuple[list[Step], dict]:
    """Its streaming API on the same audio: EOS and repetition stops off, the same budget rule."""
    import importlib

    peers = importlib.import_module("tools.peers")  # its CPU setup runs before mlx is imported
    from importlib import metadata

    import mlx.core as mx
    import mlx_qwen3_asr.streaming as st
    from mlx.utils import tree_flatten
    from mlx_qwen3_asr.load_models import _cast_tree_dtype, _model_uses_tied_lm_head, load_model

    notes: list[str] = []
    load_dir, tmp = peers._moona3k_model_dir(Path(model_dir), notes)
    model, config = load_model(str(load_dir), dtype=mx.float32)
    floating = [v for _, v in tree_flatten(model.parameters()) if mx.issubdtype(v.dtype, mx.floating)]
    if any(v.dtype != mx.float32 for v in floating):  # as tools/peers.py loads it for float32
        model.load_weights(list(tree_flatten(_cast_tree_dtype(model.parameters(), mx.float32))))
        if _model_uses_tied_lm_head(config):
            model.lm_head.weight = model.model.embed_tokens.weight
        mx.eval(model.parameters())

    seen = {"window_s": 0.0, "prefix": 0, "tokens": 0, "frames": 0}
    decode_window, rollback, decode_tokens = (
        st._decode_window,
        st._rollback_prefix_ids,
        st._decode_tokens_incremental,
    )

    def patched_window(window_audio, state, model=None):
        seen["window_s"], seen["prefix"] = len(window_audio) / state.sample_rate, 0
        return decode_window(window_audio, state, model)

    def patched_rollback(raw_ids, unfixed_tokens, tokenizer):
        ids = rollback(raw_ids, unfixed_tokens, tokenizer)
        seen["prefix"] = len(ids)
        return ids

    def patched_tokens(**kwargs):
        kwargs["eos_token_ids"] = ()
        kwargs["max_new_tokens"] = decode_budget(tokens_per_second, seen["window_s"], seen["prefix"])
        out = decode_tokens(**kwargs)
        seen["tokens"] += len(out)
        return out

    encoder = type(model.audio_tower)
    encode_frames = encoder.encode_frames

    def counted_frames(self, mel, *args, **kwargs):
        seen["frames"] += int(mel.shape[-1])
        return encode_frames(self, mel, *args, **kwargs)

    st._decode_window, st._rollback_prefix_ids = patched_window, patched_rollback
    st._decode_tokens_incremental = patched_tokens
    st.detect_repetition = lambda *args, **kwargs: False
    encoder.encode_frames = counted_frames
    notes += [
        "moona3k: EOS off (eos_token_ids=() in _decode_tokens_incremental), repetition stop off "
        "(streaming.detect_repetition -> False), each decode's budget = the same rule as ours",
        f"moona3k: max_context_sec={max_window_seconds:g} (commits the whole window when the next chunk "
        "would overflow it, cut moved back to a silence), reuse_window_prefix on (its default)",
    ]

    def new_state():
        return st.init_streaming(
            model=str(load_dir),
            chunk_size_sec=chunk_seconds,
            max_context_sec=max_window_seconds,
            language=language,
            dtype=mx.float32,
        )

    n = int(chunk_seconds * SAMPLE_RATE)
    warm = new_state()
    for k in range(warmup_chunks):
        st.feed_audio(audio[k * n : (k + 1) * n], warm, model)
    st.finish_streaming(warm, model)

    state = new_state()
    steps: list[Step] = []
    fed = 0

    def record(wall: float, final: bool) -> None:
        taken = fed - len(state.buffer)
        until = taken if final else taken - len(state.audio_accum)
        steps.append(
            Step(
                taken / SAMPLE_RATE,
                wall,
                seen["frames"] * 160,  # mel hop
                len(state.audio_accum),
                until / SAMPLE_RATE,
                seen["tokens"],
                final,
            )
        )
        seen["frames"] = seen["tokens"] = 0

    seen["frames"] = seen["tokens"] = 0
    while audio.shape[0] - fed >= n:
        start = time.perf_counter()
        st.feed_audio(audio[fed : fed + n], state, model)
        fed += n
        record(time.perf_counter() - start, final=False)
    start = time.perf_counter()
    if fed < audio.shape[0]:
        st.feed_audio(audio[fed:], state, model)
        fed = audio.shape[0]
    st.finish_streaming(state, model)
    record(time.perf_counter() - start, final=True)
    if tmp is not None:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return steps, {"version": metadata.version("mlx-qwen3-asr"), "notes": notes}


def run_peer(python: str, model_dir: Path, wav: Path, out: Path, **settings) -> dict:
    """tools/live_bench.py --peer moona3k in the peers' environment; its summary, or the error."""
    import subprocess

    cmd = [python, str(Path(__file__).resolve()), "--peer", "moona3k", "--model", str(model_dir)]
    cmd += ["--audio", str(wav), "--json", str(out)]
    for key, value in settings.items():
        cmd += [f"--{key.replace('_', '-')}", str(value)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0 or not out.exists():
        return {"error": (proc.stderr or proc.stdout).strip().splitlines()[-3:]}
    return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="one peer's live stream, timed (see tools/bench.py --mode live)")
    ap.add_argument("--peer", choices=("moona3k",), required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--audio", required=True, help="16 kHz mono wav")
    ap.add_argument("--chunk-seconds", type=float, default=2.0)
    ap.add_argument("--max-window-seconds", type=float, default=20.0)
    ap.add_argument("--tokens-per-second", type=float, default=4.0)
    ap.add_argument("--language", default="English")
    ap.add_argument("--json", required=True)
    args = ap.parse_args(argv)
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    import soundfile as sf

    audio, rate = sf.read(args.audio, dtype="float32")
    assert rate == SAMPLE_RATE
    steps, info = run_moona3k(
        Path(args.model),
        audio,
        chunk_seconds=args.chunk_seconds,
        max_window_seconds=args.max_window_seconds,
        tokens_per_second=args.tokens_per_second,
        language=args.language or None,
    )
    result = {**info, **summarize(steps, args.chunk_seconds), "step_log": [asdict(s) for s in steps]}
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
