#!/usr/bin/env bash
# The package measured on a GPU (MLX's Metal or CUDA backend) beside the peers and mlx-lm, in one go:
#   bash tools/gpu_bench.sh RESULTS_DIR          # 0.6b and 1.7b, every measurement
#   PRESET=tiny BIG=tiny QUICK=1 bash tools/gpu_bench.sh RESULTS_DIR    # a check of the script itself
# Needs the package, mlx-lm, moona3k's mlx-qwen3-asr and mlx-audio importable by python3. Each part has
# its own deadline and writes its JSON and log as soon as it ends, so a part that fails or runs out of
# time leaves the others' results.
set -uo pipefail
cd "$(dirname "$0")/.."
RESULTS=${1:?usage: tools/gpu_bench.sh RESULTS_DIR}
mkdir -p "$RESULTS"
PRESET=${PRESET:-0.6b}
BIG=${BIG:-1.7b}
QUICK=${QUICK:-0}
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
python3 -c "import mlx.core as mx; print('mlx', mx.__version__, mx.default_device(), mx.device_info())" \
    | tee "$RESULTS/parts.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >>"$RESULTS/parts.txt" 2>/dev/null

ck=$(mktemp -d)
part "checkpoint-$PRESET" 60 python3 tools/make_checkpoint.py --preset "$PRESET" -o "$ck/$PRESET"
rm -f "$RESULTS/checkpoint-$PRESET.log"

if [ "$QUICK" = 1 ]; then
    rows=1,4 steps=8 clip=4 files=3 folder=5 file=30 live=30 runs=1
else
    rows=1,4,16,32 steps=32 clip=10 files=16 folder=20 file=600 live=600 runs=1
fi

# 1. Decode step against rows, ours and mlx-lm's Qwen3 of the same shapes and weights, bfloat16 and 4-bit,
#    with where a step's time goes.
part decode 150 python3 tools/decode_bench.py --preset "$(printf '%s\n' "$PRESET" "$BIG" | sort -u | paste -sd,)" \
    --quantize none,4 --rows "$rows" --steps "$steps" --warmup 4 --profile-steps 4 --json "$RESULTS/decode.json"

# 2. Files side by side with the peers: one clip, a folder, one long file (bfloat16, same audio, same tokens).
part files 250 python3 tools/bench.py --mode all --model "$ck/$PRESET" --dtype bfloat16 --runs "$runs" \
    --clip-seconds "$clip" --files "$files" --folder-seconds "$folder" --file-seconds "$file" \
    --sweep '' --encoder-seconds '' --peers --peer-python python3 --peer-timeout 90 \
    --json "$RESULTS/files.json"

# 3. Live: compute per audio second and step time by minute of a stream played at real time.
part live 80 python3 tools/bench.py --mode live --model "$ck/$PRESET" --dtype bfloat16 \
    --live-seconds "$live" --unbounded-seconds 0 --json "$RESULTS/live.json"

echo "total $(($(date +%s) - T0)) s" | tee -a "$RESULTS/parts.txt"
rm -rf "$ck"
