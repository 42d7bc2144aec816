#!/usr/bin/env bash
# Checkpoint write and load times for GPT-2 124M (d12): one rank, then 2 ranks
# (ZeRO-1, each writing half of every tensor). Prints the trainer's own lines:
# "checkpoint ... written in N ms" and "resuming ... (verified in N ms, loaded
# in N ms)". A checkpoint of d12 is 1.5 GB (model 0.5 GB, AdamW m and v 1 GB);
# the write includes fsync, the verify a SHA-256 of every byte.
set -eu
cd "$(dirname "$0")/.."
data=${LLM3D_DATA:-../shared/data}
dir=dev/data/tinyshakespeare
out=${TMPDIR:-/tmp}/llm3d_bench_checkpoint
if ! ls $dir/tiny_shakespeare_train_*.bin >/dev/null 2>&1; then
    [ -f "$data/tinyshakespeare.txt" ] || { echo "bench_checkpoint: no $data/tinyshakespeare.txt; run 'make run' first"; exit 1; }
    ./prepare_data -i "$data/tinyshakespeare.txt" -o $dir -n tiny_shakespeare >/dev/null
fi
flags="-e d12 -b 1 -t 64 -v 0 -s 0 -i $dir/tiny_shakespeare_train_*.bin"
for layout in "-np 1" "-np 2 -z 1"; do
    rm -rf "$out"
    echo "== d12, $layout: write 2 checkpoints, then resume from the second"
    ./train_gpt2 $flags $layout -x 2 -n 1 -o "$out" | grep -E '^(model|checkpoint)'
    ./train_gpt2 $flags $layout -x 3 -y 1 -o "$out" | grep -E '^resuming'
    du -sh "$out/ckpt_00000002"
done
rm -rf "$out"
