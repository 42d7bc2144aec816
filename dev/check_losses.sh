#!/usr/bin/env bash
# Repeats the 40-step run of the small model recorded in
# dev/fixtures/small40_losses.jsonl (see dev/fixtures/README.md) and checks
# that every loss and val loss is within 1e-5 of it and every grad norm
# within 1e-4 relative: what a change to the CPU kernels may move. Prints the
# worst differences; exits 1 past the tolerances. About a minute on 2 cores.
set -eu
cd "$(dirname "$0")/.."
data=${LLM3D_DATA:-../shared/data}
dir=dev/data/tinyshakespeare
[ -x train_gpt2 ] && [ -x prepare_data ] || { echo "check_losses: run 'make' first"; exit 1; }
if ! ls $dir/tiny_shakespeare_train_*.bin >/dev/null 2>&1; then
    [ -f "$data/tinyshakespeare.txt" ] || { echo "check_losses: no $data/tinyshakespeare.txt"; exit 1; }
    ./prepare_data -i "$data/tinyshakespeare.txt" -o $dir -n tiny_shakespeare >/dev/null
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
./train_gpt2 -e d4 -ec 128 -i "$dir/tiny_shakespeare_train_*.bin" -j "$dir/tiny_shakespeare_val_*.bin" \
    -b 4 -t 64 -x 40 -v 10 -s 0 -th 2 -sd 7 -lg "$log" >/dev/null
# one line per step of each: step, loss, val loss (or -), norm; the line
# after the last step (the final model's val loss, no loss) is left out
fields() { grep '"loss"' "$1" | sed -E 's/.*"step": ([0-9]+), "loss": ([0-9.e+-]+)(, "val_loss": ([0-9.e+-]+))?, "norm": ([0-9.e+-]+).*/\1 \2 \4 \5/' |
    awk '{ if (NF == 3) print $1, $2, "-", $3; else print }'; }
paste -d' ' <(fields dev/fixtures/small40_losses.jsonl) <(fields "$log") | awk '
    function abs(x) { return x < 0 ? -x : x }
    { n++
      if ($1 != $5) { print "check_losses: step " $5 " where the recording has " $1; exit 1 }
      d = abs($2 - $6); if (d > loss) loss = d
      if ($3 != "-" && $7 != "-") { d = abs($3 - $7); if (d > val) val = d }  # the trainer now evaluates after the last step, not at it
      d = abs($4 - $8) / $4; if (d > norm) norm = d }
    END { printf("check_losses: %d steps; worst loss diff %.2e, val loss %.2e (< 1e-5); grad norm %.2e relative (< 1e-4)\n",
                 n, loss, val, norm)
          exit (n != 40 || loss >= 1e-5 || val >= 1e-5 || norm >= 1e-4) }'
