#!/usr/bin/env bash
# CPU trainer benchmark: N steps of GPT-2 124M (d12) at B=4, T=64 and of a
# small model (d4), printing ms/step, tokens/s and GFLOP/s (the trainer's own
# step lines; FLOPs = 6 x parameters per token + attention). Needs the shards
# `make run` prepares; otherwise it prepares tinyshakespeare itself.
set -eu
cd "$(dirname "$0")/.."
steps=${STEPS:-6}
data=${LLM3D_DATA:-../shared/data}
dir=dev/data/tinyshakespeare
if ! ls $dir/tiny_shakespeare_train_*.bin >/dev/null 2>&1; then
    [ -f "$data/tinyshakespeare.txt" ] || { echo "bench_cpu: no $data/tinyshakespeare.txt; run 'make run' first"; exit 1; }
    ./prepare_data -i "$data/tinyshakespeare.txt" -o $dir -n tiny_shakespeare >/dev/null
fi
for model in d12 d4; do
    echo "== $model, B=4 T=64, $steps steps, $(nproc) threads"
    ./train_gpt2 -e $model -b 4 -t 64 -x $steps -v 0 -s 0 \
        -i "$dir/tiny_shakespeare_train_*.bin" | tee /tmp/bench_cpu_$model.txt | grep -E '^(model|step)'
    # the first step warms caches and pages; report the median of the rest
    grep '^step' /tmp/bench_cpu_$model.txt | tail -n +2 | sed -E 's/.*\| ([0-9.]+) ms.*/\1/' | sort -n |
        awk '{ ms[NR] = $1 } END { printf("median of steps 1..: %.1f ms/step\n", ms[int((NR + 1) / 2)]) }'
done
