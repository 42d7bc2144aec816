#!/usr/bin/env bash
# What checked collectives (-ic 1) cost the CPU trainer: GPT-2 124M (d12),
# B=4, T=64, dp 2 (-np 2), the same build with -ic 0 and -ic 1 in turn,
# $RUNS runs of each (default 3), interleaved (0, 1, 0, 1, ...) so that a
# busy machine's slow spells fall on both alike, $STEPS steps a run (default
# 3; step 0, which warms up, left out). Prints the median step of each, their
# difference, and the checks' own time per step as rank 0 measured it in the
# -ic 1 runs ("checked collectives: X ms per step on rank 0": its sketches,
# the records' all-gathers and the verdicts), against the -ic 0 median.
# The difference of the medians holds the machine's noise; the checks' own
# time does not, and is the figure to read on a shared machine.
set -eu
cd "$(dirname "$0")/.."
runs=${RUNS:-3}
steps=${STEPS:-3}
trainer=${TRAINER:-./train_gpt2}
data=${LLM3D_DATA:-../shared/data}
dir=dev/data/tinyshakespeare
[ -x "$trainer" ] || { echo "bench_ic: no $trainer; run 'make train_gpt2' first"; exit 1; }
if ! ls $dir/tiny_shakespeare_train_*.bin >/dev/null 2>&1; then
    [ -x ./prepare_data ] || { echo "bench_ic: no ./prepare_data; run 'make prepare_data' first"; exit 1; }
    [ -f "$data/tinyshakespeare.txt" ] || { echo "bench_ic: no $data/tinyshakespeare.txt; run 'make run' first"; exit 1; }
    ./prepare_data -i "$data/tinyshakespeare.txt" -o $dir -n tiny_shakespeare >/dev/null
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "nan"; else if (NR % 2) print v[(NR + 1) / 2];
                                             else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

for r in $(seq 1 "$runs"); do
    for ic in 0 1; do
        "$trainer" -e d12 -b 4 -t 64 -np 2 -x "$steps" -v 0 -s 0 -ic $ic -i "$dir/tiny_shakespeare_train_*.bin" \
            -lg "$tmp/log_${ic}_$r.jsonl" > "$tmp/out_${ic}_$r.txt" 2>&1 || { cat "$tmp/out_${ic}_$r.txt"; exit 1; }
        # the steps after the first: their ms, one a line
        sed -nE 's/.*"step": ([0-9]+),.*"ms": ([0-9.]+).*/\1 \2/p' "$tmp/log_${ic}_$r.jsonl" |
            awk '$1 > 0 { print $2 }' >> "$tmp/ms_$ic.txt"
        sed -nE 's/^checked collectives: ([0-9.]+) ms per step on rank 0$/\1/p' "$tmp/out_${ic}_$r.txt" >> "$tmp/check_$ic.txt"
        echo "run $r -ic $ic: steps $(awk '$1 > 0 { printf "%s ", $2 }' <(sed -nE 's/.*"step": ([0-9]+),.*"ms": ([0-9.]+).*/\1 \2/p' "$tmp/log_${ic}_$r.jsonl"))ms"
    done
done
off=$(median < "$tmp/ms_0.txt")
on=$(median < "$tmp/ms_1.txt")
check=$(median < "$tmp/check_1.txt")
echo "d12, B=4, T=64, dp 2, $runs runs of $steps steps each way, step 0 left out:"
awk -v off="$off" -v on="$on" -v c="$check" 'BEGIN {
    printf "  median step: -ic 0 %.1f ms, -ic 1 %.1f ms (%+.2f%%)\n", off, on, 100 * (on - off) / off
    printf "  the checks themselves (rank 0, -ic 1): %.2f ms per step, %.3f%% of the -ic 0 median step\n", c, 100 * c / off }'
