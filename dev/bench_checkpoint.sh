#!/usr/bin/env bash
# Checkpoint write and load times for GPT-2 124M (d12): one rank, then 2 ranks
# (ZeRO-1, each writing half of every tensor), plain and sealed (-enc 1). Runs
# of the two take turns, ROUNDS times (default 3), each writing 2 checkpoints;
# prints the trainer's own lines ("checkpoint ... written in N ms", "resuming
# ... (verified in N ms, loaded in N ms)") and, per layout, the median write
# time plain and with -enc 1 and what encryption adds. A checkpoint of d12 is
# 1.5 GB (model 0.5 GB, AdamW m and v 1 GB); the write includes fsync, and
# rank 0's read back of every byte for the MANIFEST's SHA-256.
set -eu
cd "$(dirname "$0")/.."
data=${LLM3D_DATA:-../shared/data}
dir=dev/data/tinyshakespeare
out=${TMPDIR:-/tmp}/llm3d_bench_checkpoint
rounds=${ROUNDS:-3}
if ! ls $dir/tiny_shakespeare_train_*.bin >/dev/null 2>&1; then
    [ -f "$data/tinyshakespeare.txt" ] || { echo "bench_checkpoint: no $data/tinyshakespeare.txt; run 'make run' first"; exit 1; }
    ./prepare_data -i "$data/tinyshakespeare.txt" -o $dir -n tiny_shakespeare >/dev/null
fi
train=${TRAIN:-./train_gpt2}
flags="-e d12 -b 1 -t 64 -v 0 -s 0 -i $dir/tiny_shakespeare_train_*.bin"
median() { sort -n | awk '{a[NR] = $1} END {print NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
for layout in "-np 1" "-np 2 -z 1"; do
    times=$(mktemp)
    for round in $(seq "$rounds"); do
        for enc in 0 1; do
            rm -rf "$out"
            echo "== d12, $layout, -enc $enc (round $round): write 2 checkpoints, then resume from the second"
            $train $flags $layout -enc $enc -x 2 -n 1 -o "$out" | grep -E '^checkpoint' |
                tee /dev/stderr | sed -n "s/.* written in \([0-9]*\) ms/$enc \1/p" >> "$times"
            $train $flags $layout -enc $enc -x 3 -y 1 -o "$out" | grep -E '^resuming'
        done
    done
    du -sh "$out/ckpt_00000002"
    plain=$(awk '$1 == 0 {print $2}' "$times" | median)
    sealed=$(awk '$1 == 1 {print $2}' "$times" | median)
    awk -v p="$plain" -v s="$sealed" -v l="$layout" 'BEGIN {printf "d12, %s: median write %d ms plain, %d ms with -enc 1: %+.1f%%\n", l, p, s, 100 * (s - p) / p}'
    rm -f "$times"
done
rm -rf "$out"
