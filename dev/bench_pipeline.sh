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
# within 5 points of its simulated value. It exits 1 where a run fails or
# prints no bubble line, and where 1f1b has no measured bubble above 0 (its
# shares then print as n/a: a share of 0 would pass every bar).
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
#
# Then the activation memory per schedule and stage, from the last round's
# runs (it does not depend on timing, so it needs no free cores): the
# trainer's prediction (its end-of-run line: the activation sets the plan
# holds at once, and the activation gradients the backward writes), the
# rank's peak resident memory, their difference (the process's fixed part),
# what was resident just before the activations were allocated (the fixed
# part measured in the same run: the process, its model and AdamW state,
# its communicator's mapping) and what is left, mapped after them and no
# activation (the rings as messages touch them, the step's scratch). With
# THP=off (the default) the trainers run without transparent huge pages
# (prctl PR_SET_THP_DISABLE, inherited by the ranks), so each allocation
# maps what it touches in 4 KiB pages; THP=on leaves the system's setting,
# where each set maps whole 2 MiB pages, up to 2 MiB a set more.
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
thp=${THP:-off}
[ -x "$trainer" ] || { echo "bench_pipeline: no $trainer; run 'make train_gpt2' first"; exit 1; }
cores=$(nproc)
if [ "$cores" -lt "$pp" ]; then
    echo "bench_pipeline: note: $cores cores for $pp ranks of one thread each: the ranks share cores, and their"
    echo "  waits for each other's time slices count as bubble, so the measured figures exceed the schedules' own"
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
# runs a command without transparent huge pages (THP=off), or as it is
cat > "$tmp/thp.c" <<'EOF'
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>
int main(int argc, char **argv) {
    if (argc < 3 || (strcmp(argv[1], "off") == 0 && prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0) != 0)) return 1;
    execvp(argv[2], argv + 2);
    perror(argv[2]);
    return 1;
}
EOF
cc -O1 -o "$tmp/thp" "$tmp/thp.c"
tokens=$(( (steps + 2) * M * B * T + 1 ))
"$tmp/shard" "$tmp/train_000000.bin" "$tokens"

schedules=("gpipe" "1f1b" "interleaved -pv 2" "zbh1" "zbv")
for ((round = 1; round <= rounds; round++)); do
    for s in "${schedules[@]}"; do
        name=${s%% *}
        # shellcheck disable=SC2086
        if ! "$tmp/thp" "$thp" $trainer $model -b "$B" -t "$T" -d $((M * B * T)) -x "$steps" -v 0 -s 0 -th 1 \
            -i "$tmp/train_*.bin" -np "$pp" -pp "$pp" -mb "$M" -ps $s > "$tmp/out.txt" 2>&1; then
            echo "bench_pipeline: -ps $s failed:"; tail -5 "$tmp/out.txt"; exit 1
        fi
        # "... measured 0.1234 mean, ...; simulated 0.1200 mean, ... for F 1 us, B 2 us, W 3 us ...; 0.1111 by the formula"
        row=$(sed -nE 's/^pipeline bubble .*measured ([0-9.]+) mean.*simulated ([0-9.-]+) mean.*for (F [0-9]+ us, B [0-9]+ us, W [0-9]+ us).*; ([0-9.]+) by the formula.*/\1 \2 \4 \3/p' \
            "$tmp/out.txt")
        # a run without the line would leave its schedule out of the table, or 1f1b's share base empty
        [ -n "$row" ] || { echo "bench_pipeline: FAIL: -ps $s printed no pipeline bubble line:"; tail -3 "$tmp/out.txt"; exit 1; }
        echo "$name $row" >> "$tmp/results.txt"
        echo "round $round/$rounds: $name $row"
        # the memory lines: "peak resident memory per rank (MiB): a b ..." and "activation memory per
        # rank (MiB): predicted a b ...; measured a b ... (the peak less a b ... resident before them);
        # sets held at most k/n ..."; the last round's are kept
        [ "$round" -lt "$rounds" ] || awk -v name="$name" '
            /^peak resident memory per rank/ { sub(/.*: /, ""); np = split($0, peak, " ") }
            /^activation memory per rank/ {
                line = $0
                sub(/.*predicted /, "", line); sub(/;.*/, "", line); split(line, pred, " ")
                line = $0
                sub(/.*the peak less /, "", line); sub(/ resident.*/, "", line); split(line, before, " ")
                line = $0
                sub(/.*sets held at most /, "", line); split(line, sets, " ")
                for (r = 1; r <= np; r++) print name, r - 1, sets[r], pred[r], peak[r], before[r]
            }' "$tmp/out.txt" >> "$tmp/memory.txt"
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
    # no 1f1b row, or a measured bubble of 0: no share of it (n/a, not 0, which would pass any bar)
    base = ("1f1b" in meas) ? median(meas["1f1b"]) : 0
    for (i = 1; i <= count; i++) {
        s = order[i]; m = median(meas[s])
        share = base > 0 ? sprintf("%.2f", m / base) : "n/a"
        printf "%-12s %9.4f %10.4f %8.4f %12s  %s\n", s, m, median(sim[s]), formula[s], share, costs[s]
    }
    if (base <= 0) {
        printf "bench_pipeline: FAIL: %s, so the shares of it are n/a\n",
            ("1f1b" in meas) ? "1f1b'"'"'s measured bubble is " base : "no 1f1b run measured a bubble"
        exit 1
    }
}' "$tmp/results.txt" || exit 1

echo
echo "activation memory per stage (MiB), pp $pp, M $M, transparent huge pages $thp: the trainer's prediction,"
echo "the peak resident memory, their difference (the fixed part), the resident memory before the activations"
echo "(the fixed part measured in the run) and what is left (mapped after the activations, none of them)"
printf "%-12s %5s %9s %10s %9s %11s %8s %6s\n" schedule stage sets predicted "peak RSS" "difference" before left
awk '{ printf "%-12s %5d %9s %10.1f %9.1f %11.1f %8.1f %6.1f\n", $1, $2, $3, $4, $5, $5 - $4, $6, $5 - $4 - $6 }' \
    "$tmp/memory.txt"
