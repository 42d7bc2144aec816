#!/usr/bin/env bash
# The pipeline schedules side by side, measured: each of gpipe, 1f1b,
# interleaved (-pv 2), zbh1 and zbv at pp $PP (default 4) with $M micro-batches
# per step (default 8), every rank on one thread (-th 1), $STEPS steps a run
# (default 6), in $ROUNDS rounds (default 3) that run the schedules in turn, so
# that whatever else the machine does falls on all of them alike. For each
# schedule, the medians over the rounds of the run's measured bubble (the
# trainer's last line: the mean over the ranks of idle / (idle + busy), the
# launch's first step left out) and of the simulator's for the op costs
# measured in the same run, the formula's (F = B = W), and the measured
# bubble as a share of 1f1b's. The issue's bar at pp 4, M 8: zbh1 at most
# half of 1f1b's, interleaved at most 0.6, zbv at most a quarter, each
# within 5 points of its simulated value.
#
# It needs at least $PP free cores: two ranks on one core wait for each
# other's time slices, and that waiting is counted as bubble (doc/parallel.md,
# "The bubble measured"). The script says so when nproc is below $PP.
#
# The model: $MODEL (default L=8, C=256, NH=8 and a vocabulary of 256, so that
# the head costs about a tenth of a layer and the stages are even; 2 layers
# a stage, 1 a chunk for interleaved and zbv), B=$B T=$T (default 4 x 128),
# on a shard of random tokens below 256 that the script writes (with the
# tests' dev/test/test_run.h).
set -eu
cd "$(dirname "$0")/.."
pp=${PP:-4}
M=${M:-8}
steps=${STEPS:-6}
rounds=${ROUNDS:-3}
model=${MODEL:-"-e d8 -ec 256 -ev 256 -et 128"}
B=${B:-4}
T=${T:-128}
trainer=${TRAINER:-./train_gpt2}
[ -x "$trainer" ] || { echo "bench_pipeline: no $trainer; run 'make train_gpt2' first"; exit 1; }
cores=$(nproc)
if [ "$cores" -lt "$pp" ]; then
    echo "bench_pipeline: note: $cores cores for $pp ranks of one thread each: the ranks share cores, and their"
    echo "  waits for each other's time slices count as bubble, so the measured figures are not the schedules' own"
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# a shard of random tokens below 256, as the tests write one
cat > "$tmp/shard.c" <<'EOF'
#include "dev/test/test.h"
#include "dev/test/test_run.h"
int main(int argc, char **argv) { return argc == 3 && test_write_shard(argv[1], atoi(argv[2])) == 0 ? 0 : 1; }
EOF
cc -O1 -I. -o "$tmp/shard" "$tmp/shard.c" -lm
tokens=$(( (steps + 2) * M * B * T + 1 ))
"$tmp/shard" "$tmp/train_000000.bin" "$tokens"

schedules=("gpipe" "1f1b" "interleaved -pv 2" "zbh1" "zbv")
for ((round = 1; round <= rounds; round++)); do
    for s in "${schedules[@]}"; do
        name=${s%% *}
        # shellcheck disable=SC2086
        if ! $trainer $model -b "$B" -t "$T" -d $((M * B * T)) -x "$steps" -v 0 -s 0 -th 1 \
            -i "$tmp/train_*.bin" -np "$pp" -pp "$pp" -mb "$M" -ps $s > "$tmp/out.txt" 2>&1; then
            echo "bench_pipeline: -ps $s failed:"; tail -5 "$tmp/out.txt"; exit 1
        fi
        # "... measured 0.1234 mean, ...; simulated 0.1200 mean, ... for F 1 us, B 2 us, W 3 us ...; 0.1111 by the formula"
        sed -nE 's/^pipeline bubble .*measured ([0-9.]+) mean.*simulated ([0-9.-]+) mean.*for (F [0-9]+ us, B [0-9]+ us, W [0-9]+ us).*; ([0-9.]+) by the formula.*/\1 \2 \4 \3/p' \
            "$tmp/out.txt" | sed "s/^/$name /" >> "$tmp/results.txt"
        echo "round $round/$rounds: $(tail -1 "$tmp/results.txt")"
    done
done

# the medians per schedule, and the measured bubble against 1f1b's
echo
printf "%-12s %9s %10s %8s %12s  %s\n" schedule measured simulated formula "of 1f1b's" "op costs (last round)"
awk '
function median(list,    n, a, i, j, t) {
    n = split(list, a, " ")
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
{
    if (!($1 in meas)) order[++count] = $1
    meas[$1] = meas[$1] " " $2; sim[$1] = sim[$1] " " $3; formula[$1] = $4
    costs[$1] = $5 " " $6 " " $7 " " $8 " " $9 " " $10 " " $11 " " $12 " " $13
}
END {
    base = median(meas["1f1b"])
    for (i = 1; i <= count; i++) {
        s = order[i]; m = median(meas[s])
        printf "%-12s %9.4f %10.4f %8.4f %12.2f  %s\n", s, m, median(sim[s]), formula[s], (base > 0 ? m / base : 0), costs[s]
    }
}' "$tmp/results.txt"
