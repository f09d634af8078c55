"""Time a peer MLX port of Qwen3-ASR on a local checkpoint with a fixed amount of decoding work.

    peers-venv/bin/python tools/peers.py --peer moona3k|mlx-audio --model DIR --tokens-per-second R \
        --mode clip|file|folder --runs 3 --json OUT.json AUDIO1.wav [AUDIO2.wav ...]

Peers:
  moona3k   -> PyPI `mlx-qwen3-asr` (import name `mlx_qwen3_asr`)
  mlx-audio -> PyPI `mlx-audio` (mlx_audio.stt.models.qwen3_asr)

Both are bench-only dependencies: install them in a separate virtual environment, never in the
package's own. Random-weight checkpoints rarely emit EOS, so "equal work" means every segment
decodes exactly its budget of new tokens: N per segment (--new-tokens) or R per second of the
segment's audio (--tokens-per-second, the same total for the same audio however a system cuts it).
The peers' EOS stops and repetition stops are switched off and their token budgets are made per
segment (see the patch functions below). Both peers cut long
audio into segments themselves; the number of segments and tokens per segment is recorded per
file so a caller can check that the work matched.

Modes only choose the peer's entry point and batching:
  clip    one call per file, no batching options
  file    one call per file; mlx-audio batches the segments of a long file (batch_size)
  folder  one call for all files (moona3k transcribe_batch, mlx-audio generate(list));
          neither peer batches across files, so the files still run one after another

The process gets the same CPU setup as ours (mlx_qwen3asr/runtime/cpu.py): OpenBLAS loaded globally before
mlx is imported (MLX's CPU matmul is only fast with it) and glibc malloc keeping freed blocks for reuse.
Both are process settings, not model code, so the peers run with them too.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _load_cpu_module():
    """Import mlx_qwen3asr/runtime/cpu.py by file path so the package __init__ (which imports mlx) does not run."""
    path = REPO / "mlx_qwen3asr" / "runtime" / "cpu.py"
    spec = importlib.util.spec_from_file_location("_peers_cpu", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_cpu = _load_cpu_module()
BLAS_LOADED = _cpu.preload_openblas()
MALLOC_TUNED = _cpu.tune_malloc()

# Everything below may import mlx.
import argparse  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import wave  # noqa: E402
from collections import Counter  # noqa: E402
from importlib import metadata  # noqa: E402

import mlx.core as mx  # noqa: E402
from mlx.utils import tree_flatten, tree_map  # noqa: E402

PEERS = {"moona3k": "mlx-qwen3-asr", "mlx-audio": "mlx-audio"}
MODES = ("clip", "file", "folder")
DTYPES = {"float32": mx.float32, "bfloat16": mx.bfloat16, "float16": mx.float16, "native": None}
CHUNK_SECONDS = 30.0


# --------------------------------------------------------------------------------------------------
# Bookkeeping shared by the patches: which file is being processed, tokens per segment, stage times.


class Recorder:
    def __init__(self, new_tokens: int | None, stages: bool, tokens_per_second: float | None = None):
        self.new_tokens = new_tokens
        self.tokens_per_second = tokens_per_second
        self.stages = stages
        self.reset()

    def budget(self, seconds: float | None) -> int:
        """Tokens to decode for a segment: new_tokens, or tokens_per_second x its duration."""
        if self.tokens_per_second is None:
            return self.new_tokens
        if seconds is None:
            raise RuntimeError("segment duration unknown; cannot size a per-second budget")
        return max(1, round(self.tokens_per_second * seconds))

    def reset(self) -> None:
        self.files: list[dict] = []
        self.times = Counter()
        self.pending_seconds: float | None = None

    def begin_file(self) -> None:
        self.files.append({"tokens_per_segment": [], "segment_seconds": []})

    def segment(self, tokens: int, seconds: float | None) -> None:
        if not self.files:
            self.begin_file()
        self.files[-1]["tokens_per_segment"].append(int(tokens))
        self.files[-1]["segment_seconds"].append(None if seconds is None else round(float(seconds), 3))
        self.files[-1].setdefault("budgets", []).append(self.budget(seconds))

    def add_time(self, stage: str, seconds: float) -> None:
        self.times[stage] += seconds


STATE = Recorder(new_tokens=0, stages=True)


def _timed_eval(stage: str, fn):
    """Wrap fn so its result is evaluated and the time is added to `stage` (only when stages are on)."""

    def wrapper(*args, **kwargs):
        if not STATE.stages:
            return fn(*args, **kwargs)
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        mx.eval(out)
        STATE.add_time(stage, time.perf_counter() - t0)
        return out

    wrapper.__wrapped__ = fn
    return wrapper


def _cast_floating(params, dtype):
    return tree_map(lambda x: x.astype(dtype) if mx.issubdtype(x.dtype, mx.floating) else x, params)


def _name(dtype) -> str:
    return str(dtype).replace("mlx.core.", "")


def _param_dtypes(model) -> dict[str, int]:
    return dict(Counter(_name(v.dtype) for _, v in tree_flatten(model.parameters())))


def _dtype_summary(model, activations) -> str:
    """'float32', or 'weights bfloat16 / activations float32' when they differ."""
    counts = _param_dtypes(model)
    weights = max(counts, key=counts.get)
    act = _name(activations)
    return weights if weights == act else f"weights {weights} / activations {act}"


# --------------------------------------------------------------------------------------------------
# moona3k / mlx-qwen3-asr


_MOONA_PATCHED = False


def _patch_moona3k(notes: list[str]) -> None:
    """Force exactly its budget of tokens per segment and record segments/stage times.

    - transcribe.generate (the module alias transcribe() calls per chunk) is wrapped: the
      GenerationConfig gets eos_token_ids=[] so EOS never stops decoding, and max_new_tokens = the
      chunk's budget (the chunk length is recorded by the compute_features wrapper just before). The wrapper records generated_tokens per chunk.
    - generate._detect_repetition is replaced by a function returning False, so the repetition stop
      (20 repeats of a token or a short pattern) never ends a chunk early.
    - transcribe._transcribe_loaded_components (one call per audio file) is wrapped to start a new
      per-file record; transcribe.compute_features (one call per chunk) records the chunk length.
    - Stage times: AudioEncoder.__call__ and Qwen3ASRModel.prefill are wrapped to evaluate their
      result and time it; the sync points are ones the pipeline hits right after anyway (the prompt
      is built on the host, then prefill's logits are read by the sampler). decode = generate - prefill.
    """
    global _MOONA_PATCHED
    import mlx_qwen3_asr.encoder as enc_mod
    import mlx_qwen3_asr.generate as gen_mod
    import mlx_qwen3_asr.model as model_mod

    # The package re-exports a function named `transcribe`, which hides the submodule of that name.
    tr_mod = importlib.import_module("mlx_qwen3_asr.transcribe")

    notes += [
        "moona3k: EOS disabled (GenerationConfig.eos_token_ids=[] via a wrapper on transcribe.generate)",
        "moona3k: repetition stop disabled (generate._detect_repetition -> False)",
        "moona3k: max_new_tokens = the chunk's budget (GenerationConfig per chunk); chunks ~30 s (its fixed MAX_CHUNK_SECONDS, "
        "recursive split at the lowest-energy point in the middle 60%)",
        "moona3k: no batching of chunks or files exists; folder mode uses transcribe_batch (sequential)",
    ]
    if _MOONA_PATCHED:
        return
    _MOONA_PATCHED = True

    orig_generate = tr_mod.generate

    def generate(model, input_ids, audio_features, position_ids, config=None):
        from dataclasses import replace

        config = replace(config, eos_token_ids=[], max_new_tokens=STATE.budget(STATE.pending_seconds))
        t0 = time.perf_counter()
        prefill_before = STATE.times["prefill_s"]
        out = orig_generate(
            model=model,
            input_ids=input_ids,
            audio_features=audio_features,
            position_ids=position_ids,
            config=config,
        )
        if STATE.stages:
            total = time.perf_counter() - t0
            STATE.add_time("decode_s", total - (STATE.times["prefill_s"] - prefill_before))
        STATE.segment(len(out.tokens) if hasattr(out, "tokens") else len(out), STATE.pending_seconds)
        STATE.files[-1].setdefault("prompt_tokens", []).append(int(input_ids.shape[1]))
        return out

    tr_mod.generate = generate
    gen_mod._detect_repetition = lambda tokens, threshold=gen_mod.REPETITION_THRESHOLD: False

    orig_components = tr_mod._transcribe_loaded_components

    def transcribe_loaded_components(**kwargs):
        STATE.begin_file()
        return orig_components(**kwargs)

    tr_mod._transcribe_loaded_components = transcribe_loaded_components

    orig_features = tr_mod.compute_features

    def compute_features(chunk_audio, *args, **kwargs):
        STATE.pending_seconds = len(chunk_audio) / tr_mod.SAMPLE_RATE
        return orig_features(chunk_audio, *args, **kwargs)

    tr_mod.compute_features = compute_features

    enc_mod.AudioEncoder.__call__ = _timed_eval("encoder_s", enc_mod.AudioEncoder.__call__)
    model_mod.Qwen3ASRModel.prefill = _timed_eval("prefill_s", model_mod.Qwen3ASRModel.prefill)


def _moona3k_model_dir(model_dir: Path, notes: list[str]) -> tuple[Path, Path | None]:
    """moona3k asserts sum(mrope_section) == head_dim // 2, which the tiny random preset (head_dim 16 with the
    release's [24, 20, 20]) breaks. ASR prompts use the same position on all three MRoPE axes, so any split
    gives identical results; rescale the sections in a temporary copy of the config (weights symlinked)."""
    config = json.loads((model_dir / "config.json").read_text())
    text = config.get("thinker_config", config).get("text_config", {})
    rope = text.get("rope_scaling") or {}
    sections = rope.get("mrope_section")
    half = int(text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"]) // 2
    if not sections or sum(sections) == half:
        return model_dir, None
    scaled = [max(1, s * half // sum(sections)) for s in sections]
    scaled[0] += half - sum(scaled)
    rope["mrope_section"] = scaled
    tmp = Path(tempfile.mkdtemp(prefix="peers_moona3k_"))
    for item in model_dir.iterdir():
        if item.name != "config.json":
            (tmp / item.name).symlink_to(item.resolve())
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    notes.append(f"moona3k: mrope_section {sections} -> {scaled} in a temp config copy (head_dim/2={half})")
    return tmp, tmp


def _run_moona3k(model_dir, audio_paths, mode, dtype_name, language, batch_size, notes):
    import mlx_qwen3_asr
    from mlx_qwen3_asr.load_models import _cast_tree_dtype, _model_uses_tied_lm_head, load_model
    from mlx_qwen3_asr.tokenizer import _TokenizerHolder

    _patch_moona3k(notes)
    load_dir, tmp = _moona3k_model_dir(Path(model_dir), notes)
    dtype = DTYPES[dtype_name]

    # moona3k's loader casts floating params to `dtype` except when dtype is float32: then the checkpoint's
    # dtypes stay (bfloat16 for the release) and activations run in float32 against bfloat16 weights. For
    # float32, cast the way its loader does for other dtypes and re-tie the LM head to the embedding as it
    # does. "native" keeps its own float32 behaviour unchanged.
    t0 = time.perf_counter()
    run_dtype = dtype or mx.float32
    model, config = load_model(str(load_dir), dtype=run_dtype)
    floating = [v for _, v in tree_flatten(model.parameters()) if mx.issubdtype(v.dtype, mx.floating)]
    if dtype is not None and any(v.dtype != dtype for v in floating):
        params = _cast_tree_dtype(model.parameters(), dtype)
        model.load_weights(list(tree_flatten(params)))
        if _model_uses_tied_lm_head(config):
            model.lm_head.weight = model.model.embed_tokens.weight
        mx.eval(model.parameters())
        notes.append(
            f"moona3k: load_model(dtype={_name(dtype)}) kept checkpoint dtypes; cast floating params to it"
        )
    _TokenizerHolder.get(model._resolved_model_path)
    load_s = time.perf_counter() - t0

    # The per-chunk budget is set in the generate wrapper; the public argument only has to allow it.
    kwargs = dict(model=model, dtype=run_dtype, max_new_tokens=1 << 20, language=language)

    def run_once():
        if mode == "folder":
            mlx_qwen3_asr.transcribe_batch(list(audio_paths), **kwargs)
        else:
            for path in audio_paths:
                mlx_qwen3_asr.transcribe(path, **kwargs)

    def cleanup():
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)

    return dict(
        version=metadata.version("mlx-qwen3-asr"),
        load_s=load_s,
        dtype=_dtype_summary(model, run_dtype),
        param_dtypes=_param_dtypes(model),
        settings={"dtype": _name(run_dtype), "language": language},
        run_once=run_once,
        cleanup=cleanup,
    )


# --------------------------------------------------------------------------------------------------
# mlx-audio


_AUDIO_PATCHED = False


def _patch_mlx_audio(notes: list[str]) -> None:
    """Force exactly the budgeted tokens per segment and record segments/stage times.

    - Qwen3ASRModel._eos_token_ids returns an empty set, so EOS stops neither the sequential path
      (stream_generate) nor the batched one (_generate_chunks_batched). mlx-audio has no repetition stop
      (repetition_penalty is a logits processor and stays off).
    - mlx-audio's max_tokens is one budget for the whole file, shared by its segments. To give every
      segment its budget, _generate_single_chunk is called with max_tokens = that budget, and
      _generate_chunks_batched is called once per group of batch_size segments with max_tokens = the
      sum of the group's budgets (its rows decode round-robin until the group has spent it, so the
      group's total is exact; with equal budgets every row gets its own). The outer generate() gets a budget large enough to never stop a file.
    - _generate_one (one call per audio file) is wrapped to start a new per-file record.
    - Stage times: get_audio_features and _build_inputs_embeds are wrapped to evaluate and time their
      result (the sequential path evaluates both right after anyway); lm.generate.generate_step is wrapped
      so the time to its first token is prefill and the rest is decode (sequential path only; the batched
      path reports prefill+decode together).
    """
    global _AUDIO_PATCHED
    import mlx_audio.lm.generate as lm_gen
    import mlx_audio.stt.models.qwen3_asr.qwen3_asr as qa

    notes += [
        "mlx-audio: EOS disabled (Qwen3ASRModel._eos_token_ids -> empty set); it has no repetition stop",
        "mlx-audio: per-segment budget of N tokens (its max_tokens is per file; calls re-issued per segment/group)",
        f"mlx-audio: chunk_duration={CHUNK_SECONDS:g} s (API default 1200 s, CLI default 30 s); cut at the "
        "lowest-energy point within +-5 s of each 30 s mark",
        "mlx-audio: no cross-file batching exists; folder mode calls generate(list), which runs files in turn",
        "mlx-audio: computes one decode step past the last kept token (pipelined async_eval), and re-runs the "
        "feature extractor once per segment to count prompt tokens (sequential path)",
    ]
    if _AUDIO_PATCHED:
        return
    _AUDIO_PATCHED = True
    cls = qa.Qwen3ASRModel

    cls._eos_token_ids = lambda self: set()

    orig_single = cls._generate_single_chunk

    def generate_single_chunk(self, audio_chunk, *, max_tokens=8192, **kwargs):
        seconds = len(audio_chunk) / self.sample_rate
        text, prompt_toks, gen_toks = orig_single(
            self, audio_chunk, max_tokens=STATE.budget(seconds), **kwargs
        )
        STATE.segment(gen_toks, len(audio_chunk) / self.sample_rate)
        STATE.files[-1].setdefault("prompt_tokens", []).append(int(prompt_toks))
        return text, prompt_toks, gen_toks

    cls._generate_single_chunk = generate_single_chunk

    orig_batched = cls._generate_chunks_batched

    def generate_chunks_batched(self, chunks, *, max_tokens, batch_size, **kwargs):
        t0 = time.perf_counter()
        before = STATE.times["encoder_s"] + STATE.times["embed_s"]
        texts, gen, prompt, processed = [], [], [], []
        for b0 in range(0, len(chunks), batch_size):
            group = chunks[b0 : b0 + batch_size]
            # One budget per group, shared round-robin by its rows: the sum of theirs.
            budget = sum(STATE.budget(len(audio) / self.sample_rate) for audio, _ in group)
            out = orig_batched(self, group, max_tokens=budget, batch_size=batch_size, **kwargs)
            for lst, part in zip((texts, gen, prompt, processed), out):
                lst.extend(part)
            for (audio, _), n, p in zip(group, out[1], out[2]):
                STATE.segment(n, len(audio) / self.sample_rate)
                STATE.files[-1].setdefault("prompt_tokens", []).append(int(p))
            STATE.files[-1].setdefault("batches", []).append(len(group))
        if STATE.stages:
            spent = STATE.times["encoder_s"] + STATE.times["embed_s"] - before
            STATE.add_time("prefill_decode_s", time.perf_counter() - t0 - spent)
        return texts, gen, prompt, processed

    cls._generate_chunks_batched = generate_chunks_batched

    orig_one = cls._generate_one

    def generate_one(self, audio, **kwargs):
        STATE.begin_file()
        return orig_one(self, audio, **kwargs)

    cls._generate_one = generate_one

    cls.get_audio_features = _timed_eval("encoder_s", cls.get_audio_features)
    cls._build_inputs_embeds = _timed_eval("embed_s", cls._build_inputs_embeds)

    orig_step = lm_gen.generate_step

    def generate_step(*args, **kwargs):
        t0 = time.perf_counter()
        first = True
        try:
            for item in orig_step(*args, **kwargs):
                if first and STATE.stages:
                    STATE.add_time("prefill_s", time.perf_counter() - t0)
                    t0 = time.perf_counter()
                first = False
                yield item
        finally:
            if not first and STATE.stages:
                STATE.add_time("decode_s", time.perf_counter() - t0)

    lm_gen.generate_step = generate_step


def _run_mlx_audio(model_dir, audio_paths, mode, dtype_name, language, batch_size, notes):
    from mlx_audio.stt.utils import load_model

    _patch_mlx_audio(notes)
    dtype = DTYPES[dtype_name]

    t0 = time.perf_counter()
    model = load_model(str(model_dir))
    inner = model._model
    if dtype is not None:
        # mlx-audio has no dtype option: weights keep the checkpoint's dtype (bfloat16 for the release).
        inner.update(_cast_floating(inner.parameters(), dtype))
        mx.eval(inner.parameters())
        notes.append(f"mlx-audio: no dtype option; cast floating params to {_name(dtype)} after load")
    load_s = time.perf_counter() - t0
    dtypes = _param_dtypes(inner)

    bsz = batch_size if mode in ("file", "folder") else 1
    kwargs = dict(
        max_tokens=1 << 40,
        batch_size=bsz,
        language=language,
        chunk_duration=CHUNK_SECONDS,
        verbose=False,
    )
    notes.append(f"mlx-audio: batch_size={bsz} (segments of one file decoded together when a file has >1)")

    def run_once():
        if mode == "folder":
            model.generate(list(audio_paths), **kwargs)
        else:
            for path in audio_paths:
                model.generate(path, **kwargs)

    return dict(
        version=metadata.version("mlx-audio"),
        load_s=load_s,
        dtype=max(dtypes, key=dtypes.get),
        param_dtypes=dtypes,
        settings={k: v for k, v in kwargs.items() if k != "max_tokens"},
        run_once=run_once,
        cleanup=lambda: None,
    )


# --------------------------------------------------------------------------------------------------


def audio_seconds(path: str) -> float:
    try:
        import soundfile

        info = soundfile.info(path)
        return info.frames / info.samplerate
    except ImportError:
        with wave.open(path) as w:
            return w.getnframes() / w.getframerate()


def run_peer(
    peer: str,
    model_dir: str | Path,
    audio_paths: list[str],
    new_tokens: int | None,
    mode: str,
    runs: int = 3,
    *,
    tokens_per_second: float | None = None,
    dtype: str = "float32",
    language: str | None = None,
    batch_size: int = 8,
    warmup: int = 0,
    stages: bool = True,
) -> dict:
    """Load the peer once, then process all audio_paths `runs` times; return the result record."""
    if peer not in PEERS:
        raise ValueError(f"unknown peer {peer!r}; choose from {sorted(PEERS)}")
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose from {MODES}")
    if (new_tokens is None) == (tokens_per_second is None):
        raise ValueError("give exactly one of new_tokens and tokens_per_second")
    if (new_tokens is not None and new_tokens < 1) or (
        tokens_per_second is not None and tokens_per_second <= 0
    ):
        raise ValueError("the token budget must be positive")
    audio_paths = [str(Path(p)) for p in audio_paths]
    STATE.new_tokens = new_tokens
    STATE.tokens_per_second = tokens_per_second
    STATE.stages = stages
    STATE.reset()
    notes: list[str] = [
        f"OpenBLAS preloaded: {BLAS_LOADED and f'{BLAS_LOADED} ({_cpu.openblas_core()} kernels)' or 'no'}",
        f"malloc tuned: {MALLOC_TUNED}",
    ]

    runner = _run_moona3k if peer == "moona3k" else _run_mlx_audio
    info = runner(Path(model_dir), audio_paths, mode, dtype, language, batch_size, notes)

    records = []
    try:
        for i in range(warmup + runs):
            STATE.reset()
            mx.clear_cache()
            mx.reset_peak_memory()
            t0 = time.perf_counter()
            info["run_once"]()
            wall = time.perf_counter() - t0
            if i < warmup:
                continue
            files = [dict(path=p, **f) for p, f in zip(audio_paths, STATE.files)]
            if len(STATE.files) != len(audio_paths):
                notes.append(
                    f"run {len(records)}: {len(STATE.files)} file records for {len(audio_paths)} files"
                )
            tokens = [t for f in STATE.files for t in f["tokens_per_segment"]]
            budgets = [b for f in STATE.files for b in f.get("budgets", [])]
            records.append(
                {
                    "wall_s": round(wall, 4),
                    "tokens": sum(tokens),
                    "segments": len(tokens),
                    "segments_per_file": [len(f["tokens_per_segment"]) for f in STATE.files],
                    "budget_tokens": sum(budgets),
                    # Equal work: every segment's budget decoded (batched rows share theirs, so totals).
                    "tokens_match_budget": sum(tokens) == sum(budgets) and len(tokens) == len(budgets),
                    "stages": {k: round(v, 4) for k, v in STATE.times.items()} if stages else None,
                    "peak_memory_bytes": int(mx.get_peak_memory()),
                    "files": files,
                }
            )
    finally:
        info["cleanup"]()

    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {
        "peer": peer,
        "package": PEERS[peer],
        "version": info["version"],
        "mlx_version": mx.__version__,
        "dtype": info["dtype"],
        "param_dtypes": info["param_dtypes"],
        "mode": mode,
        "new_tokens": new_tokens,
        "tokens_per_second": tokens_per_second,
        "load_s": round(info["load_s"], 4),
        "runs": records,
        "median_wall_s": round(statistics.median(r["wall_s"] for r in records), 4) if records else None,
        "audio_seconds": round(sum(audio_seconds(p) for p in audio_paths), 3),
        "segments_per_file": records[0]["segments_per_file"] if records else None,
        "tokens_match_budget": all(r["tokens_match_budget"] for r in records),
        "maxrss_bytes": maxrss,
        "settings": info["settings"],
        "device": str(mx.default_device()),
        "notes": notes,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--peer", required=True, choices=sorted(PEERS))
    parser.add_argument("--model", required=True, help="checkpoint directory (release layout)")
    budget = parser.add_mutually_exclusive_group(required=True)
    budget.add_argument("--new-tokens", type=int, help="new tokens decoded per segment")
    budget.add_argument("--tokens-per-second", type=float, help="new tokens per second of each segment")
    parser.add_argument("--mode", choices=MODES, default="clip")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=0, help="untimed runs before the timed ones")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--language", default=None, help="force a language (default: auto-detect prompt)")
    parser.add_argument(
        "--batch-size", type=int, default=8, help="mlx-audio segments per batch (file/folder)"
    )
    parser.add_argument("--no-stages", action="store_true", help="skip the stage timers")
    parser.add_argument("--json", help="write the result here (default: stdout)")
    parser.add_argument("audio", nargs="+")
    args = parser.parse_args(argv)

    result = run_peer(
        args.peer,
        args.model,
        args.audio,
        args.new_tokens,
        args.mode,
        args.runs,
        tokens_per_second=args.tokens_per_second,
        dtype=args.dtype,
        language=args.language,
        batch_size=args.batch_size,
        warmup=args.warmup,
        stages=not args.no_stages,
    )
    text = json.dumps(result, indent=2)
    if args.json:
        Path(args.json).write_text(text + "\n")
        print(
            f"{result['peer']} {result['version']} {args.mode}: load {result['load_s']:.2f} s, "
            f"median {result['median_wall_s']:.3f} s, segments/file {result['segments_per_file']}, "
            f"tokens match budget: {result['tokens_match_budget']}",
            file=sys.stderr,
        )
    else:
        print(text)
    return 0 if result["tokens_match_budget"] else 1


if __name__ == "__main__":
    sys.exit(main())
