#!/usr/bin/env bash
# The package measured on a GPU (MLX's Metal or CUDA backend) beside the peers and mlx-lm, in one go:
#   bash tools/gpu_bench.sh RESULTS_DIR
#   PRESET=tiny DECODE_PRESETS=tiny QUICK=1 bash tools/gpu_bench.sh RESULTS_DIR   # a check of the script
# Parts (PARTS, space-separated; default all but the cache check):
#   decode     decode step against rows, ours and mlx-lm's Qwen3 of the same shapes and weights
#              (DECODE_PRESETS, DECODE_QUANT, ROWS, STEPS, PROFILE_ROWS), with where a step's time goes
#   files      one clip, a folder and one long file beside moona3k's mlx-qwen3-asr and mlx-audio
#              (MODES: clip, file, folder or all; RUNS)
#   live       compute per audio second and step time by minute of a stream played at real time
#   cache      the clip with and without MLX's buffer cache released at joins and every 256 steps
# Needs the package, mlx-lm, moona3k's mlx-qwen3-asr and mlx-audio importable by python3. Each part has
# its own deadline and writes its JSON and log as soon as it ends, so a part that fails or runs out of
# time leaves the others' results.
set -uo pipefail
cd "$(dirname "$0")/.."
RESULTS=${1:?usage: tools/gpu_bench.sh RESULTS_DIR}
mkdir -p "$RESULTS"
PRESET=${PRESET:-0.6b}
QUICK=${QUICK:-0}
PARTS=${PARTS:-decode files live}
if [ "$QUICK" = 1 ]; then
    rows=1,4 steps=8 clip=4 files=3 folder=5 file=30 live=30
else
    rows=1,4,16,32 steps=32 clip=10 files=16 folder=20 file=600 live=600
fi
DECODE_PRESETS=${DECODE_PRESETS:-0.6b,1.7b}
DECODE_QUANT=${DECODE_QUANT:-none,4}
ROWS=${ROWS:-$rows}
STEPS=${STEPS:-$steps}
PROFILE_ROWS=${PROFILE_ROWS:-1,16}
MODES=${MODES:-all}
RUNS=${RUNS:-1}
export PYTHONUNBUFFERED=1
T0=$(date +%s)
part() {  # part NAME SECONDS command...: one measurement, its log in RESULTS/NAME.log
    local name=$1 limit=$2
    shift 2
    local start=$(date +%s)
    timeout --kill-after=10 "$limit" "$@" >"$RESULTS/$name.log" 2>&1
    local rc=$?
    echo "$name: rc $rc, $(($(date +%s) - start)) s (at $(($(date +%s) - T0)) s)" | tee -a "$RESULTS/parts.txt"
}
wants() { [[ " $PARTS " == *" $1 "* ]]; }
python3 -c "import mlx.core as mx; print('mlx', mx.__version__, mx.default_device(), mx.device_info())" \
    | tee -a "$RESULTS/parts.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >>"$RESULTS/parts.txt" 2>/dev/null

ck=$(mktemp -d)
if wants files || wants live || wants cache; then
    part "checkpoint-$PRESET" 60 python3 tools/make_checkpoint.py --preset "$PRESET" -o "$ck/$PRESET"
    rm -f "$RESULTS/checkpoint-$PRESET.log"
fi

if wants decode; then
    for p in ${DECODE_PRESETS//,/ }; do
        part "decode-$p" 150 python3 tools/decode_bench.py --preset "$p" --quantize "$DECODE_QUANT" \
            --rows "$ROWS" --steps "$STEPS" --warmup 4 --profile-rows "$PROFILE_ROWS" --profile-steps 4 \
            --json "$RESULTS/decode-$p.json"
    done
fi

if wants cache; then
    part cache 60 python3 - "$ck/$PRESET" "$clip" <<'PY'
import sys
from pathlib import Path

import soundfile as sf

sys.path.insert(0, ".")
import mlx.core as mx  # noqa: E402

import mlx_qwen3asr  # noqa: E402
from tools import bench  # noqa: E402

model = mlx_qwen3asr.load(sys.argv[1])
wav = Path("/tmp/cache-clip.wav")
sf.write(wav, bench.speechlike(float(sys.argv[2]), seed=0), 16000, subtype="PCM_16")
budget = bench.Budget(per_second=4.0)
bench.run_ours(model, [wav], bench.Budget(new_tokens=4), None)
released = mx.clear_cache
for label in ("released", "kept", "released", "kept"):
    mx.clear_cache = released if label == "released" else (lambda: None)
    runs = [bench.run_ours(model, [wav], budget, None) for _ in range(3)]
    walls = sorted(r.wall_s for r in runs)
    decode = sorted(r.stages["decode"] for r in runs)
    print(f"cache {label}: wall {walls[1]:.3f} s, decode {decode[1]:.3f} s, {runs[0].tokens} tokens")
PY
fi

if wants files; then
    # The same audio and tokens for every system, bfloat16; each peer warmed up once, as ours is.
    part files 250 python3 tools/bench.py --mode "$MODES" --model "$ck/$PRESET" --dtype bfloat16 --runs "$RUNS" \
        --clip-seconds "$clip" --files "$files" --folder-seconds "$folder" --file-seconds "$file" \
        --sweep '' --encoder-seconds '' --peers --peer-python python3 --peer-timeout 90 --peer-warmup 1 \
        --json "$RESULTS/files.json"
fi

if wants live; then
    part live 80 python3 tools/bench.py --mode live --model "$ck/$PRESET" --dtype bfloat16 \
        --live-seconds "$live" --unbounded-seconds 0 --json "$RESULTS/live.json"
fi

echo "total $(($(date +%s) - T0)) s" | tee -a "$RESULTS/parts.txt"
rm -rf "$ck"
