"""Decode step time of our decoder against mlx-lm's Qwen3 decoder of the same shapes and weights.

    python tools/decode_bench.py --preset tiny --rows 1,4 --steps 8 --quantize 4 --json /tmp/d.json
    python tools/decode_bench.py --preset 0.6b,1.7b --quantize none,4 --rows 1,4,16,32 --json d.json

For each preset a random-weight checkpoint in the release layout is written once into a temporary
folder (tools/make_checkpoint.py) and, with --quantize 4 (or 8), converted by our converter
(mlx_qwen3asr.checkpoints.convert, group size 64, decoder and embedding quantized, encoder left float).
--quantize takes a list: `none` is the checkpoint as written, in --dtype.

1. Step time against rows. Our side is mlx_qwen3asr.model.batch.DecodeBatch, run twice: with its step
   compiled (model/step.py, the default: `ours`) and built op by op (MLXASR_COMPILE=0: `eager`),
   reporting how many traces the compiled run made and how many tokens the two agree on. `add` prefills
   --prompt-tokens text-only positions per row (no audio features), then `step()` advances every row
   one token with the next step kept in flight. The loop stop is off (LOOP_CHECK_EVERY) and no token
   ends a row (no EOS ids), so every row decodes the whole budget. mlx-lm's side is its qwen3.Model
   built with the same sizes, holding our model's own decoder weights (the same arrays: for a
   quantized checkpoint mlx-lm's model is quantized on exactly the layers ours is, at the same group
   size and bits, before the weights are loaded into it), run by mlx-lm's own loops:
   mlx_lm.generate.generate_step for one row and mlx_lm.generate.BatchGenerator for several (or, in an
   mlx-lm without it, a batched loop over make_prompt_cache stepping as mlx-lm's batch loop does).
   Reported: the median wall time of one step (one token for every row) over --steps steps after
   --warmup steps, tokens per second, our time over mlx-lm's, and how many of the first tokens of
   row 0 both systems agree on (the same weights and prompt: they should, up to float ties).
2. Where a step's time goes (--profile-rows, after the timed steps): each system's own step run with
   its module's `mx.async_eval` timed, which splits a step into building the lazy graph (host),
   the async_eval call itself (scheduling; on MLX's CPU backend it waits there for the step in
   flight), and the rest, which is mostly the read of the previous step's tokens (`.tolist()` /
   `.item()`: the wait on the device, the next step being in flight) plus the host's per-row
   bookkeeping; the same step started with the device idle (`host only`: no
   wait, so its pure host cost); and the step's forward graph (decoder, head, argmax and the scores
   the loop reads) built alone and evaluated alone with mx.eval (`eval alone`: device time plus
   encoding, nothing else in flight), with its node count (the primitives mx.export_to_dot lists).
   A step time near `host only` means the loop is bound by the host; near `eval alone`, by the device.

The table names the device (mx.default_device(), mx.device_info()) and the MLX and mlx-lm versions;
--json writes everything, every step time included.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import io
import json
import math
import os
import platform
import re
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

# isort: off
# mlx_qwen3asr goes first: it preloads OpenBLAS, which MLX's CPU matmul only picks up if loaded before it.
import mlx_qwen3asr  # noqa: E402
import mlx.core as mx  # noqa: E402

# isort: on
mlx_qwen3asr.tune_malloc()  # as the commands do
import mlx.nn as nn  # noqa: E402
import numpy as np  # noqa: E402
from mlx.utils import tree_flatten  # noqa: E402

from mlx_qwen3asr.model import batch as decoding  # noqa: E402
from mlx_qwen3asr.model import step as step_module  # noqa: E402

DEFAULT_ROWS = "1,4,16,32"
PROMPT_LOW, PROMPT_HIGH = 1000, 150000  # ordinary text tokens (the special ones start at 151643)


# --------------------------------------------------------------------------------------------------
# Small helpers


def token_budget(args) -> int:
    """New tokens per row: the warm-up, timed and profiled steps, with room to spare (never reached)."""
    return args.warmup + args.steps + 2 * args.profile_steps + 8


def parse_list(text: str, cast=str) -> list:
    return [cast(x.strip()) for x in text.split(",") if x.strip()]


def median_ms(seconds: list[float]) -> float:
    return 1000.0 * statistics.median(seconds) if seconds else float("nan")


def prompts_for(rows: int, length: int, seed: int = 0) -> list[list[int]]:
    """One text-only prompt per row, all of `length` tokens (no padding on either side)."""
    rng = np.random.default_rng(seed)
    return [rng.integers(PROMPT_LOW, PROMPT_HIGH, size=length).tolist() for _ in range(rows)]


def agreement(a: list[int], b: list[int]) -> int:
    """Leading tokens the two lists share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def graph_nodes(*outputs) -> dict:
    """Primitives in the lazy graph of `outputs` (mx.export_to_dot), and the most frequent ones."""
    try:
        out = io.StringIO()
        mx.export_to_dot(out, *outputs)
    except Exception as e:  # an MLX without export_to_dot, or one that cannot write to a stream
        return {"nodes": None, "error": f"{type(e).__name__}: {e}"}
    labels = re.findall(r'\[label ="([^"]+)", shape=rectangle\]', out.getvalue())
    return {"nodes": len(labels), "top": Counter(labels).most_common(8)}


# Streams a sync waits for: the default one and, once mlx-lm is imported, its generation stream (its
# loops run there, and mx.synchronize() alone waits only for the default stream).
STREAMS: list = []


def sync() -> None:
    mx.synchronize()
    for stream in STREAMS:
        mx.synchronize(stream)


class _TimedAsyncEval:
    """Stands in for `mlx.core` inside a decoding loop's module: every attribute is MLX's, and each
    async_eval call is recorded as (start, end) in perf_counter seconds."""

    def __init__(self, real):
        self._real = real
        self.marks: list[tuple[float, float]] = []

    def __getattr__(self, name):
        return getattr(self._real, name)

    def async_eval(self, *args, **kwargs):
        start = time.perf_counter()
        self._real.async_eval(*args, **kwargs)
        self.marks.append((start, time.perf_counter()))


@contextlib.contextmanager
def timed_async_eval(module):
    """Record the async_eval calls `module` makes (its global `mx` replaced for the block)."""
    clock = _TimedAsyncEval(module.mx)
    module.mx = clock
    try:
        yield clock
    finally:
        module.mx = clock._real


def profile_steps(step, clock: _TimedAsyncEval, n: int) -> dict:
    """Run `step` n times in flight, then n times with the device idle at its start, splitting each at
    its async_eval call."""

    def run(idle: bool) -> dict:
        parts: dict[str, list[float]] = {"step": [], "build": [], "async_eval": [], "after": []}
        for _ in range(n):
            if idle:
                sync()
            clock.marks.clear()
            start = time.perf_counter()
            step()
            end = time.perf_counter()
            parts["step"].append(end - start)
            if len(clock.marks) == 1:
                (a, b) = clock.marks[0]
                parts["build"].append(a - start)
                parts["async_eval"].append(b - a)
                parts["after"].append(end - b)
        return {k: median_ms(v) for k, v in parts.items()}

    step()  # the step before the first one recorded is in flight again
    in_flight = run(idle=False)
    idle = run(idle=True)
    sync()
    return {
        "step_ms": in_flight["step"],
        "build_ms": in_flight["build"],
        "async_eval_ms": in_flight["async_eval"],
        "after_async_eval_ms": in_flight["after"],
        "host_only_ms": idle["step"],
        "host_only_build_ms": idle["build"],
        "host_only_async_eval_ms": idle["async_eval"],
        "host_only_after_async_eval_ms": idle["after"],
    }


def graph_alone(build, repeats: int = 3) -> dict:
    """Build one step's forward graph (host time), count its nodes, evaluate it alone (mx.eval with the
    device idle before): medians over `repeats`."""
    builds, evals, nodes = [], [], None
    for i in range(repeats):
        sync()
        start = time.perf_counter()
        outputs = build()
        built = time.perf_counter()
        if i == 0:
            nodes = graph_nodes(*outputs)
        start_eval = time.perf_counter()
        mx.eval(*outputs)
        end = time.perf_counter()
        builds.append(built - start)
        evals.append(end - start_eval)
    return {"graph_build_ms": median_ms(builds), "graph_eval_ms": median_ms(evals), "graph": nodes}


# --------------------------------------------------------------------------------------------------
# Our side


@contextlib.contextmanager
def no_loop_stop():
    saved = decoding.LOOP_CHECK_EVERY
    decoding.LOOP_CHECK_EVERY = 10**9
    try:
        yield
    finally:
        decoding.LOOP_CHECK_EVERY = saved


@contextlib.contextmanager
def compile_mode(on: bool):
    """Our decoding step compiled (model/step.py, the default) or eager, while active."""
    saved = os.environ.get(step_module.ENV)
    os.environ[step_module.ENV] = "1" if on else "0"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(step_module.ENV, None)
        else:
            os.environ[step_module.ENV] = saved


def run_ours(net, prompts: list[list[int]], args, profile: bool, compiled: bool = True) -> dict:
    rows = len(prompts)
    budget = token_budget(args)
    hidden = net.config.text_config.hidden_size
    traces = step_module.Traces.count
    with no_loop_stop(), compile_mode(compiled):
        if compiled and not step_module.compiling():
            raise RuntimeError("MLX cannot compile here")
        # No EOS ids: no token ends a row; the budget is never reached in the steps timed.
        batch = decoding.DecodeBatch(net, frozenset())
        start = time.perf_counter()
        done = batch.add(prompts, [mx.zeros((0, hidden))] * rows, [budget] * rows, list(range(rows)))
        mx.eval(batch.y, batch.scores)
        prefill_s = time.perf_counter() - start
        assert not done and len(batch) == rows
        for _ in range(args.warmup):
            batch.step()
        times = []
        for _ in range(args.steps):
            start = time.perf_counter()
            finished = batch.step()
            times.append(time.perf_counter() - start)
            if finished:
                raise RuntimeError(f"a row finished during the timed steps: {finished[0][0]!r}")
        sync()
        result = {
            "loop": "DecodeBatch.step" + (" (compiled)" if compiled else " (eager)"),
            "prefill_s": prefill_s,
            "step_s": times,
            "tokens": list(batch.rows[0].tokens),
        }
        if profile:
            with timed_async_eval(decoding) as clock:
                result["profile"] = profile_steps(batch.step, clock, args.profile_steps)

            def build():
                y, _, scores = batch._forward()  # the step's graph: compiled (replayed) or eager
                return y, scores

            result["profile"].update(graph_alone(build))
        result["traces"] = step_module.Traces.count - traces
    return result


# --------------------------------------------------------------------------------------------------
# mlx-lm's side


def import_mlx_lm():
    """(mlx_lm, mlx_lm.generate module, mlx_lm.models.qwen3), or the ImportError's text."""
    try:
        import mlx_lm

        # `mlx_lm.generate` is also the name of a function mlx_lm's package exports; take the module.
        gen = importlib.import_module("mlx_lm.generate")
        qwen3 = importlib.import_module("mlx_lm.models.qwen3")
        importlib.import_module("mlx_lm.models.cache")
    except ImportError as e:
        return None, f"{type(e).__name__}: {e}"
    if getattr(gen, "generation_stream", None) is not None:
        STREAMS.append(gen.generation_stream)
    return (mlx_lm, gen, qwen3), None


def text_config_json(path: Path) -> dict:
    config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    return config.get("thinker_config", config).get("text_config", {})


def build_mlx_lm(qwen3, net, raw_text: dict):
    """mlx-lm's Qwen3 model of our decoder's sizes, holding our decoder's weights (the same arrays);
    quantized on the layers ours is. Random weights (quantized as mlx-lm does) if ours do not fit."""
    t = net.config.text_config
    args = qwen3.ModelArgs(
        model_type="qwen3",
        hidden_size=t.hidden_size,
        num_hidden_layers=t.num_hidden_layers,
        intermediate_size=t.intermediate_size,
        num_attention_heads=t.num_attention_heads,
        rms_norm_eps=t.rms_norm_eps,
        vocab_size=t.vocab_size,
        num_key_value_heads=t.num_key_value_heads,
        max_position_embeddings=int(raw_text.get("max_position_embeddings", 65536)),
        head_dim=t.head_dim,
        tie_word_embeddings=t.tie_word_embeddings,
        rope_theta=t.rope_theta,
        # Qwen3-ASR's MRoPE with equal positions on every axis is plain RoPE (model/decoder.py).
        rope_scaling=None,
    )
    quantized = {
        path: {"group_size": m.group_size, "bits": m.bits}
        for path, m in net.named_modules()
        if isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding))
        and (path.startswith("model.") or path == "lm_head")
    }
    ours = {"model": net.model.parameters()}
    if "lm_head" in net:
        ours["lm_head"] = net.lm_head.parameters()
    lm = qwen3.Model(args)
    if quantized:
        nn.quantize(lm, class_predicate=lambda path, m: quantized.get(path, False))
    try:
        lm.load_weights(tree_flatten(ours), strict=True)
        source = "ours (shared arrays)"
    except ValueError as e:
        print(f"mlx-lm's model does not take our weights ({e}); random weights instead", file=sys.stderr)
        lm = qwen3.Model(args)
        lm.set_dtype(net.model.norm.weight.dtype)
        if quantized:
            first = next(iter(quantized.values()))
            nn.quantize(lm, group_size=first["group_size"], bits=first["bits"])
        source = "random"
    mx.eval(lm.parameters())
    return lm, {"args": {k: v for k, v in vars(args).items() if not k.startswith("_")}, "weights": source}


def _lm_step_graph(lm, cache, rows: int, batched: bool):
    """The forward graph of one mlx-lm decoding step as its loop builds it (the input token's value
    does not change the work)."""

    def build():
        tokens = mx.zeros((rows,), dtype=mx.uint32)
        logits = lm(tokens[:, None], cache=cache)[:, -1, :]
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        y = mx.argmax(logprobs, axis=-1)
        return (y, *list(logprobs)) if batched else (y, logprobs.squeeze(0))

    return build


def run_mlx_lm_single(mods, lm, prompt: list[int], args, profile: bool) -> dict:
    _, gen, _ = mods
    cache_mod = importlib.import_module("mlx_lm.models.cache")
    budget = token_budget(args)
    cache = cache_mod.make_prompt_cache(lm)
    steps = gen.generate_step(mx.array(prompt, dtype=mx.uint32), lm, max_tokens=budget, prompt_cache=cache)
    start = time.perf_counter()
    tokens = [next(steps)[0]]  # prefill and the first token
    prefill_s = time.perf_counter() - start
    for _ in range(args.warmup - 1):
        tokens.append(next(steps)[0])
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        tokens.append(next(steps)[0])
        times.append(time.perf_counter() - start)
    sync()
    result = {"loop": "mlx_lm.generate.generate_step", "prefill_s": prefill_s, "step_s": times}
    result["tokens"] = list(tokens)
    if profile:
        with timed_async_eval(gen) as clock:
            result["profile"] = profile_steps(lambda: next(steps), clock, args.profile_steps)
    steps.close()
    if profile:
        result["profile"].update(graph_alone(_lm_step_graph(lm, cache, 1, batched=False)))
    return result


def run_mlx_lm_batch(mods, lm, prompts: list[list[int]], args, profile: bool) -> dict:
    _, gen, _ = mods
    if not hasattr(gen, "BatchGenerator"):
        return run_mlx_lm_manual_batch(lm, prompts, args, profile)
    rows = len(prompts)
    budget = token_budget(args)
    bg = gen.BatchGenerator(
        lm, max_tokens=budget, stop_tokens=None, completion_batch_size=rows, prefill_batch_size=rows
    )
    try:
        uids = bg.insert(prompts, max_tokens=[budget] * rows)
        first = uids[0]
        tokens: list[int] = []

        def step():
            responses = bg.next_generated()
            if len(responses) != rows or any(r.finish_reason for r in responses):
                raise RuntimeError(f"mlx-lm's batch gave {len(responses)} rows, or finished one")
            tokens.extend(r.token for r in responses if r.uid == first)

        start = time.perf_counter()
        while not tokens:  # prefill, until the first tokens come
            responses = bg.next_generated()
            tokens.extend(r.token for r in responses if r.uid == first)
        prefill_s = time.perf_counter() - start
        for _ in range(args.warmup - 1):
            step()
        times = []
        for _ in range(args.steps):
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
        sync()
        result = {"loop": "mlx_lm.generate.BatchGenerator", "prefill_s": prefill_s, "step_s": times}
        result["tokens"] = list(tokens)
        if profile:
            with timed_async_eval(gen) as clock:
                result["profile"] = profile_steps(step, clock, args.profile_steps)
            cache = getattr(getattr(bg, "_generation_batch", None), "prompt_cache", None)
    finally:
        bg.close()
    if profile:
        if cache is None:  # a BatchGenerator laid out otherwise: a plain cache of the same rows instead
            cache = importlib.import_module("mlx_lm.models.cache").make_prompt_cache(lm)
            mx.eval(lm(mx.array(prompts, dtype=mx.uint32), cache=cache))
            result["profile"]["graph_cache"] = "plain KVCache"
        result["profile"].update(graph_alone(_lm_step_graph(lm, cache, rows, batched=True)))
    return result


def run_mlx_lm_manual_batch(lm, prompts: list[list[int]], args, profile: bool) -> dict:
    """Rows of one length stepped as mlx-lm's GenerationBatch does (for an mlx-lm without
    BatchGenerator): the next step built and async-evaluated, then the current tokens read."""
    cache_mod = importlib.import_module("mlx_lm.models.cache")
    rows = len(prompts)
    cache = cache_mod.make_prompt_cache(lm)
    ids = mx.array(prompts, dtype=mx.uint32)
    state = {}

    def forward(tokens):
        logits = lm(tokens[:, None], cache=cache)[:, -1, :]
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        return mx.argmax(logprobs, axis=-1), list(logprobs)

    tokens: list[int] = []

    def step():
        current = state["next"]
        state["next"] = forward(current[0])
        mx.async_eval(*state["next"][0:1], state["next"][1])
        mx.eval(current[0], current[1])
        tokens.append(current[0].tolist()[0])

    start = time.perf_counter()
    mx.eval(lm(ids[:, :-1], cache=cache))
    state["next"] = forward(ids[:, -1])
    mx.async_eval(state["next"][0], state["next"][1])
    step()
    prefill_s = time.perf_counter() - start
    for _ in range(args.warmup - 1):
        step()
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    sync()
    result = {"loop": "make_prompt_cache batch loop", "prefill_s": prefill_s, "step_s": times}
    result["tokens"] = list(tokens)
    if profile:
        this = sys.modules[__name__]
        with timed_async_eval(this) as clock:
            result["profile"] = profile_steps(step, clock, args.profile_steps)
        result["profile"].update(graph_alone(_lm_step_graph(lm, cache, rows, batched=True)))
    return result


# --------------------------------------------------------------------------------------------------
# Checkpoints and runs


def describe_device() -> dict:
    try:
        info = {
            k: (v if isinstance(v, (int, float, str, bool)) else str(v)) for k, v in mx.device_info().items()
        }
    except Exception as e:  # older MLX: mx.metal.device_info only
        info = {"error": f"{type(e).__name__}: {e}"}
    return {"default_device": str(mx.default_device()), "info": info}


def capture_note() -> str:
    metal = getattr(mx, "metal", None)
    cuda = getattr(mx, "cuda", None)
    if metal is not None and metal.is_available():
        return "Metal: mx.metal.start_capture/stop_capture exist (a .gputrace); not used by this script"
    if cuda is not None and cuda.is_available():
        return "CUDA: MLX has no capture call of its own; run under nsys/ncu for kernel timelines (not used)"
    return "CPU backend: no GPU capture tool applies; device time is the graph's mx.eval time"


def make_checkpoints(preset: str, quantize: list[str], work: Path, dtype: str) -> tuple[dict, dict]:
    """{quantize setting: checkpoint path} for one preset, and the seconds each took to make."""
    from tools.make_checkpoint import write_checkpoint

    paths, seconds = {}, {}
    start = time.perf_counter()
    source = write_checkpoint(work / f"{preset}-release", preset, seed=0)
    seconds["write"] = time.perf_counter() - start
    for q in quantize:
        if q == "none":
            paths[q] = source
            continue
        from mlx_qwen3asr.checkpoints.convert import convert_checkpoint

        start = time.perf_counter()
        dst = work / f"{preset}-{q}bit"
        convert_checkpoint(source, dst, bits=int(q), group_size=64, dtype=dtype, force=True)
        seconds[f"convert_{q}bit"] = time.perf_counter() - start
        paths[q] = dst
    made = ", ".join(f"{k} {v:.1f} s" for k, v in seconds.items())
    print(f"{preset}: checkpoint {made}", flush=True)
    return paths, seconds


def run_config(path: Path, label: dict, args, mods) -> dict:
    start = time.perf_counter()
    asr = mlx_qwen3asr.load(path, dtype=args.dtype)
    load_s = time.perf_counter() - start
    net = asr.net
    t = net.config.text_config
    out = {
        **label,
        "dtype": args.dtype,
        "load_s": load_s,
        "text_config": {
            k: getattr(t, k)
            for k in (
                "hidden_size",
                "num_hidden_layers",
                "intermediate_size",
                "num_attention_heads",
                "num_key_value_heads",
                "head_dim",
                "vocab_size",
                "tie_word_embeddings",
            )
        },
        "rows": [],
    }
    lm = None
    if mods is not None:
        lm, out["mlx_lm_model"] = build_mlx_lm(mods[2], net, text_config_json(path))
    for rows in args.rows:
        prompts = prompts_for(rows, args.prompt_tokens, seed=rows)
        profile = rows in args.profile_rows
        entry: dict = {"rows": rows}
        # A failure on one side is recorded (and makes the exit status 1) and the run goes on, so that
        # one unsupported case does not cost the rest of a run on a borrowed machine.
        ours = attempt(entry, "ours", run_ours, net, prompts, args, profile)
        if ours is not None:
            entry["ours"] = summarize(ours, rows)
        eager = attempt(entry, "eager", run_ours, net, prompts, args, profile, False)
        if eager is not None:
            entry["eager"] = summarize(eager, rows)
            if ours is not None:
                entry["compiled_over_eager"] = entry["ours"]["ms_per_step"] / entry["eager"]["ms_per_step"]
                n = min(len(ours["tokens"]), len(eager["tokens"]))
                entry["compiled_eager_agree"] = [agreement(ours["tokens"], eager["tokens"]), n]
        if lm is not None:
            if rows == 1:
                theirs = attempt(entry, "mlx_lm", run_mlx_lm_single, mods, lm, prompts[0], args, profile)
            else:
                theirs = attempt(entry, "mlx_lm", run_mlx_lm_batch, mods, lm, prompts, args, profile)
            if theirs is not None:
                entry["mlx_lm"] = summarize(theirs, rows)
            if ours is not None and theirs is not None:
                ratio = entry["ours"]["ms_per_step"] / entry["mlx_lm"]["ms_per_step"]
                entry["ratio_ours_over_mlx_lm"] = ratio
                n = min(len(ours["tokens"]), len(theirs["tokens"]))
                entry["tokens_agree"] = [agreement(ours["tokens"], theirs["tokens"]), n]
        out["rows"].append(entry)
        mx.clear_cache()
        print_row(label, entry, args)
    del lm, net, asr
    gc.collect()
    mx.clear_cache()
    return out


def attempt(entry: dict, side: str, run, *args):
    """run(*args), or None with the error recorded in entry[f"{side}_error"] and printed."""
    try:
        return run(*args)
    except Exception as e:
        entry[f"{side}_error"] = traceback.format_exc()
        print(f"{side}, {entry['rows']} rows: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        sync_quietly()
        return None


def sync_quietly() -> None:
    with contextlib.suppress(Exception):
        sync()


def summarize(run: dict, rows: int) -> dict:
    ms = median_ms(run["step_s"])
    out = {
        "loop": run["loop"],
        "ms_per_step": ms,
        "tokens_per_s": rows * 1000.0 / ms,
        "prefill_s": run["prefill_s"],
        "step_ms": [1000.0 * s for s in run["step_s"]],
        "tokens_row0": run["tokens"][:16],
    }
    if "traces" in run:
        out["traces"] = run["traces"]
    if "profile" in run:
        out["profile"] = run["profile"]
    return out


# --------------------------------------------------------------------------------------------------
# Output


def fmt(x, digits=2) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return f"{x:.{digits}f}"


HEADER = (
    f"{'model':<14} {'rows':>4} {'ours ms':>9} {'eager ms':>9} {'mlx-lm ms':>9} {'ours/lm':>7} "
    f"{'ours tok/s':>10} {'lm tok/s':>10} {'agree':>7} {'eager':>7}"
)


def print_row(label: dict, entry: dict, args) -> None:
    """ours: the compiled step (the default); eager: the same step built op by op; agree: row 0's
    tokens ours and mlx-lm's agree on; eager: ours compiled and eager."""
    ours, theirs, eager = entry.get("ours") or {}, entry.get("mlx_lm"), entry.get("eager")
    agree, same = entry.get("tokens_agree"), entry.get("compiled_eager_agree")
    name = f"{label['preset']} {label['weights']}"
    print(
        f"{name:<14} {entry['rows']:>4} {fmt(ours.get('ms_per_step')):>9} "
        f"{fmt(eager and eager['ms_per_step']):>9} "
        f"{fmt(theirs and theirs['ms_per_step']):>9} {fmt(entry.get('ratio_ours_over_mlx_lm')):>7} "
        f"{fmt(ours.get('tokens_per_s'), 0):>10} {fmt(theirs and theirs['tokens_per_s'], 0):>10} "
        f"{(f'{agree[0]}/{agree[1]}' if agree else '-'):>7} {(f'{same[0]}/{same[1]}' if same else '-'):>7}",
        flush=True,
    )


def print_profiles(configs: list[dict]) -> None:
    lines = []
    for config in configs:
        for entry in config["rows"]:
            for system in ("ours", "eager", "mlx_lm"):
                p = (entry.get(system) or {}).get("profile")
                if not p:
                    continue
                nodes = (p.get("graph") or {}).get("nodes")
                lines.append(
                    f"{config['preset'] + ' ' + config['weights']:<14} {entry['rows']:>4} "
                    f"{system:<7} {fmt(p['step_ms']):>7} {fmt(p['build_ms']):>7} "
                    f"{fmt(p['async_eval_ms']):>7} {fmt(p['after_async_eval_ms']):>7} "
                    f"{fmt(p['host_only_ms']):>9} {fmt(p['graph_build_ms']):>7} {fmt(p['graph_eval_ms']):>7} "
                    f"{nodes if nodes is not None else '-':>6}"
                )
    if not lines:
        return
    print()
    print("Where a step's time goes (ms, medians). step: one step with the next in flight; build: from")
    print("the step's start to its async_eval call (host: the lazy graph built); async: the async_eval call")
    print("(MLX's CPU backend may wait there for the step in flight); read: the rest, the read of the")
    print("previous step's tokens (.tolist()/.item(), the wait on the device) and per-row bookkeeping;")
    print("host only: the same step with the device idle at its start; build1/eval1: the step's forward")
    print("graph built alone, then evaluated alone (mx.eval); nodes: its primitives (mx.export_to_dot).")
    print(
        f"{'model':<14} {'rows':>4} {'system':<7} {'step':>7} {'build':>7} {'async':>7} {'read':>7} "
        f"{'host only':>9} {'build1':>7} {'eval1':>7} {'nodes':>6}"
    )
    for line in lines:
        print(line)


def versions(mods) -> dict:
    out = {"mlx": mx.__version__, "mlx_lm": None, "python": platform.python_version()}
    out["platform"] = platform.platform()
    if mods is not None:
        out["mlx_lm"] = getattr(mods[0], "__version__", "?")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny", help="checkpoint presets, comma-separated (tiny, 0.6b, 1.7b)")
    ap.add_argument("--model", default=None, help="an existing checkpoint folder instead of --preset")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    ap.add_argument(
        "--quantize",
        default="none",
        help="weights to measure, comma-separated: none (as written), 4, 8 (our converter, group size 64)",
    )
    ap.add_argument("--rows", default=DEFAULT_ROWS, help=f"row counts (default {DEFAULT_ROWS})")
    ap.add_argument("--steps", type=int, default=32, help="steps timed per row count")
    ap.add_argument("--warmup", type=int, default=8, help="steps before the timed ones")
    ap.add_argument("--prompt-tokens", type=int, default=100, help="prompt positions per row")
    ap.add_argument(
        "--profile-rows", default="1,16", help="row counts whose step is broken down (`none`: none)"
    )
    ap.add_argument("--profile-steps", type=int, default=8, help="steps per breakdown")
    ap.add_argument("--no-mlx-lm", action="store_true", help="only our side")
    ap.add_argument("--work-dir", default=None, help="where the checkpoints are written (default a temp dir)")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args(argv)
    began = time.perf_counter()
    args.rows = parse_list(args.rows, int)
    args.profile_rows = [] if args.profile_rows == "none" else parse_list(args.profile_rows, int)
    quantize = parse_list(args.quantize)
    for q in quantize:
        if q not in ("none", "4", "8"):
            ap.error(f"--quantize: {q!r} is not none, 4 or 8")
    if args.steps < 1 or args.warmup < 1 or args.prompt_tokens < 2 or any(r < 1 for r in args.rows):
        ap.error("--steps, --warmup and the row counts must be at least 1, --prompt-tokens at least 2")

    mods, mlx_lm_error = (None, "--no-mlx-lm") if args.no_mlx_lm else import_mlx_lm()
    report = {
        "versions": versions(mods),
        "device": describe_device(),
        "capture": capture_note(),
        "mlx_lm": {"available": mods is not None, "error": mlx_lm_error},
        "settings": {
            "dtype": args.dtype,
            "rows": args.rows,
            "steps": args.steps,
            "warmup": args.warmup,
            "prompt_tokens": args.prompt_tokens,
            "profile_rows": args.profile_rows,
            "profile_steps": args.profile_steps,
            "quantize": quantize,
        },
        "configs": [],
    }
    v, d = report["versions"], report["device"]
    print(f"device: {d['default_device']} {json.dumps(d['info'])}")
    print(
        f"mlx {v['mlx']}, mlx-lm {v['mlx_lm'] or 'absent (' + str(mlx_lm_error) + ')'}, python {v['python']}"
    )
    print(f"capture: {report['capture']}")
    print(
        f"{args.prompt_tokens}-token prompts, median of {args.steps} steps after {args.warmup}; "
        f"dtype {args.dtype}; no EOS, no loop stop"
    )
    print()
    print(HEADER)

    if args.model and quantize != ["none"]:
        ap.error("--quantize applies to --preset checkpoints only")
    with contextlib.ExitStack() as stack:
        if args.work_dir:
            work = Path(args.work_dir)
            work.mkdir(parents=True, exist_ok=True)
        else:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="decode-bench-")))
        for preset in [Path(args.model).name] if args.model else parse_list(args.preset):
            if args.model:
                paths, seconds = {"none": Path(args.model)}, {}
            else:  # one preset's checkpoints on disk at a time
                paths, seconds = make_checkpoints(preset, quantize, work, args.dtype)
            for q in quantize:
                label = {"preset": preset, "weights": args.dtype if q == "none" else f"{q}bit"}
                config = run_config(paths[q], label, args, mods)
                config["checkpoint_s"] = seconds
                report["configs"].append(config)
                write_report(report, args.json)  # as it goes: a run cut short keeps what it measured
            if not args.model and not args.work_dir:
                for path in {*paths.values()}:
                    shutil.rmtree(path, ignore_errors=True)

    print_profiles(report["configs"])
    report["elapsed_s"] = time.perf_counter() - began
    write_report(report, args.json)
    errors = [
        f"{c['preset']} {c['weights']} {e['rows']} rows {key[: -len('_error')]}"
        for c in report["configs"]
        for e in c["rows"]
        for key in e
        if key.endswith("_error")
    ]
    print(f"\n{report['elapsed_s']:.0f} s in all" + (f"; wrote {args.json}" if args.json else ""))
    if errors:
        print(f"failed: {'; '.join(errors)} (tracebacks in the JSON)", file=sys.stderr)
        return 1
    return 0


def write_report(report: dict, path: str | None) -> None:
    if path:
        Path(path).write_text(json.dumps(report, indent=1, default=str) + "\n", encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
