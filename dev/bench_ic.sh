#!/usr/bin/env bash
# What checked collectives (-ic 1) cost the CPU trainer: GPT-2 124M (d12),
# B=4, T=64, dp 2 (-np 2), the same build with -ic 0 and -ic 1 in turn,
# $RUNS runs of each (default 3), interleaved (0, 1, 0, 1, ...) so that a
# busy machine's slow spells fall on both alike, $STEPS steps a run (default
# 3; step 0, which warms up, left out). BEFORE=./other_build adds that
# build's -ic 0 and -ic 1 runs to each round (before, then after), to
# compare two builds on the same machine at the same time.
#
# Prints the median step of each, their difference, and the checks' own
# cost per step on rank 0, which holds none of the machine's noise outside
# the collectives: the trainer's line "checked collectives: X ms per step
# on rank 0 in the checks' own passes, records and verdicts; Y ms in its
# reducing receives' sums, sketched in the same pass" (-ic 1), and
# "unchecked collectives: Y0 ms ... sums" (-ic 0): the cost is X + Y - Y0,
# medians over the runs (the reducing receives make the sums either way, and
# under -ic 1 sketch them in the same pass). A build whose lines lack Y and
# Y0 (one that made every sketch in a pass of its own) costs X. Then each
# round's cost against its own -ic 0 run, and their median: on a shared
# machine whose load swings between rounds, the figure to read.
set -eu
cd "$(dirname "$0")/.."
runs=${RUNS:-3}
steps=${STEPS:-3}
trainer=${TRAINER:-./train_gpt2}
before=${BEFORE:-}
data=${LLM3D_DATA:-../shared/data}
dir=dev/data/tinyshakespeare
[ -x "$trainer" ] || { echo "bench_ic: no $trainer; run 'make train_gpt2' first"; exit 1; }
[ -z "$before" ] || [ -x "$before" ] || { echo "bench_ic: BEFORE=$before is not an executable"; exit 1; }
if ! ls $dir/tiny_shakespeare_train_*.bin >/dev/null 2>&1; then
    [ -x ./prepare_data ] || { echo "bench_ic: no ./prepare_data; run 'make prepare_data' first"; exit 1; }
    [ -f "$data/tinyshakespeare.txt" ] || { echo "bench_ic: no $data/tinyshakespeare.txt; run 'make run' first"; exit 1; }
    ./prepare_data -i "$data/tinyshakespeare.txt" -o $dir -n tiny_shakespeare >/dev/null
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "nan"; else if (NR % 2) print v[(NR + 1) / 2];
                                             else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

builds="after"
[ -z "$before" ] || builds="before after"
for r in $(seq 1 "$runs"); do
    for b in $builds; do
        exe=$trainer
        [ "$b" = after ] || exe=$before
        for ic in 0 1; do
            k="${b}_$ic"
            "$exe" -e d12 -b 4 -t 64 -np 2 -x "$steps" -v 0 -s 0 -ic $ic -i "$dir/tiny_shakespeare_train_*.bin" \
                -lg "$tmp/log_${k}_$r.jsonl" > "$tmp/out_${k}_$r.txt" 2>&1 || { cat "$tmp/out_${k}_$r.txt"; exit 1; }
            # the steps after the first: their ms, one a line
            steps_ms=$(sed -nE 's/.*"step": ([0-9]+),.*"ms": ([0-9.]+).*/\1 \2/p' "$tmp/log_${k}_$r.jsonl" |
                       awk '$1 > 0 { print $2 }')
            echo "$steps_ms" >> "$tmp/ms_$k.txt"
            echo "$steps_ms" | median > "$tmp/run_ms_${k}_$r.txt"
            out="$tmp/out_${k}_$r.txt"
            x=$(sed -nE 's/^checked collectives: ([0-9.]+) ms per step on rank 0.*/\1/p' "$out")
            y=$(sed -nE 's/^(checked|unchecked) collectives: .* ([0-9.]+) ms in its reducing receives.*/\2/p;
                       s/^unchecked collectives: ([0-9.]+) ms per step on rank 0 in its reducing receives.*/\1/p' "$out")
            [ "$ic" = 0 ] || echo "${x:-nan}" >> "$tmp/check_$k.txt"
            echo "${y:-0}" >> "$tmp/sum_$k.txt"
            echo "${y:-0}" > "$tmp/run_sum_${k}_$r.txt"
            # this round's cost against its own -ic 0 run: the machine's load
            # moves both alike within a round, where it moves the medians apart
            if [ "$ic" = 1 ]; then
                awk -v x="${x:-nan}" -v y1="${y:-0}" -v y0="$(cat "$tmp/run_sum_${b}_0_$r.txt")" \
                    -v off="$(cat "$tmp/run_ms_${b}_0_$r.txt")" 'BEGIN { print 100 * (x + y1 - y0) / off }' >> "$tmp/ratio_$b.txt"
            fi
            echo "run $r $b -ic $ic: steps $(echo $steps_ms) ms; checks ${x:--} ms, receives' sums ${y:--} ms per step"
        done
    done
done
echo "d12, B=4, T=64, dp 2, $runs runs of $steps steps each way, step 0 left out:"
for b in $builds; do
    off=$(median < "$tmp/ms_${b}_0.txt")
    on=$(median < "$tmp/ms_${b}_1.txt")
    x=$(median < "$tmp/check_${b}_1.txt")
    y1=$(median < "$tmp/sum_${b}_1.txt")
    y0=$(median < "$tmp/sum_${b}_0.txt")
    label=""
    [ -z "$before" ] || label="$b ($([ "$b" = after ] && echo "$trainer" || echo "$before")): "
    awk -v off="$off" -v on="$on" -v x="$x" -v y1="$y1" -v y0="$y0" -v label="$label" 'BEGIN {
        c = x + y1 - y0
        printf "  %smedian step: -ic 0 %.1f ms, -ic 1 %.1f ms (%+.2f%%)\n", label, off, on, 100 * (on - off) / off
        printf "  %sthe checks themselves (rank 0): %.2f ms per step (own passes %.2f, receives %.2f against %.2f), " \
               "%.3f%% of the -ic 0 median step\n", label, c, x, y1, y0, 100 * c / off }'
    echo "  ${label}each round's checks against its own -ic 0 run's median step: $(sort -g "$tmp/ratio_$b.txt" |
        awk '{ printf "%.2f%% ", $1 }')(median $(median < "$tmp/ratio_$b.txt")%)"
done
