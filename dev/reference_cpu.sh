#!/usr/bin/env bash
# dev/reference_cpu.sh: the CPU reference run, and the check that a fresh one
# reproduces the committed loss curve.
#
#   dev/reference_cpu.sh           run afresh and compare (about 10 minutes on one core)
#   dev/reference_cpu.sh --quick   the first 3 minutes only, compared step for step as far as it got
#   dev/reference_cpu.sh --write   run afresh and commit-ready: this run becomes the reference
#
# The run: a GPT-2-shaped model of 4 layers and 128 channels, with GPT-2's
# 50257-token BPE (7.3M parameters, 6.4M of them in the embedding), trained
# from the seeded init for 800 steps of 8 x 128 tokens (0.82M tokens, 2.7
# epochs of tinyshakespeare's train split, shuffled), AdamW at lr 1e-3 with 50
# warmup steps and a cosine to 1e-4, weight decay 0.1, clip 1.0, val loss on
# the whole val split (-m -1: its 31 batches, 31744 of its 32768 tokens, each
# counted once) every 100 steps and after the last, on one thread (-th 1).
# The numbers do not depend on the thread count, since every sum has a fixed
# order; one thread is the count a busy machine slows down least.
#
# The check (dev/compare_logs): the val losses where both runs measured one
# within 0.01, and the train loss averaged over each 50 steps within 0.02.
# doc/reproducing.md says why these tolerances, and what a run on the same
# machine class gives (identical losses).
#
# Env: LLM3D_DATA (default ../shared/data) holds tinyshakespeare.txt and
# gpt2/encoder.json, gpt2/vocab.bpe. Exit status: 0 reproduced, 1 not, 2 no
# data or no build.
set -u
cd "$(dirname "$0")/.."
mode=${1:-check}
case "$mode" in
    check|--quick|--write) ;;
    *) echo "usage: dev/reference_cpu.sh [--quick | --write]"; exit 2 ;;
esac
data=${LLM3D_DATA:-../shared/data}
reference=dev/reference/cpu_tinyshakespeare.jsonl
out=dev/data/reference_cpu
for f in "$data/tinyshakespeare.txt" "$data/gpt2/encoder.json" "$data/gpt2/vocab.bpe"; do
    [ -f "$f" ] || { echo "reference_cpu: $f is missing (set LLM3D_DATA to the directory that holds tinyshakespeare.txt and gpt2/)"; exit 2; }
done
for p in train_gpt2 prepare_data plot_log dev/compare_logs; do
    [ -x "$p" ] || { echo "reference_cpu: ./$p is not built: run make"; exit 2; }
done
[ "$mode" = --write ] || [ -f "$reference" ] || { echo "reference_cpu: no $reference to compare with (make one with --write)"; exit 2; }

mkdir -p "$out"
./prepare_data -i "$data/tinyshakespeare.txt" -o "$out" -n tiny --encoder "$data/gpt2/encoder.json" \
    --vocab "$data/gpt2/vocab.bpe" >/dev/null || exit 2
rm -rf "$out/run"
mkdir -p "$out/run"
flags=(-e d4 -ec 128 -ev 50257 -et 128 -i "$out/tiny_train_*.bin" -j "$out/tiny_val_*.bin"
       -b 8 -t 128 -x 800 -l 1e-3 -u 50 -q 0.1 -c 0.1 -gc 1.0 -sh 1 -sd 1337
       -v 100 -m -1 -s 0 -th 1 -o "$out/run")
limit=()
[ "$mode" = --quick ] && limit=(timeout 180)
echo "reference_cpu: training (${mode#--}): ./train_gpt2 ${flags[*]}"
start=$(date +%s)
"${limit[@]}" ./train_gpt2 "${flags[@]}" > "$out/run/train.txt" 2>&1
rc=$?
seconds=$(( $(date +%s) - start ))
grep -E "^(model|batch):|^val loss" "$out/run/train.txt"
tail -n 1 "$out/run/train.txt"
if [ "$mode" = --quick ] && [ "$rc" -eq 124 ]; then
    echo "reference_cpu: stopped after ${seconds} s, as --quick does"
elif [ "$rc" -ne 0 ]; then
    echo "reference_cpu: train_gpt2 exited with status $rc after ${seconds} s (its output: $out/run/train.txt)"
    exit 1
else
    echo "reference_cpu: trained in ${seconds} s"
fi
# a trainer stopped by a signal checkpoints and exits 0: only a log of every
# step is a whole run (the final model's line, a val loss alone, has no "loss")
steps=$(grep -c '"loss"' "$out/run/log.jsonl")
if [ "$mode" != --quick ] && [ "$steps" -ne 800 ]; then
    echo "reference_cpu: the log has $steps steps of 800: the run was stopped ($out/run/train.txt)"
    exit 1
fi

if [ "$mode" = --write ]; then
    mkdir -p dev/reference
    cp "$out/run/log.jsonl" "$reference"
    ./plot_log "$reference" -o "$out/run/plot.svg" --baselines none --title "CPU reference run (written now)" >/dev/null
    echo "reference_cpu: wrote $reference ($steps steps in ${seconds} s); plot: $out/run/plot.svg"
    exit 0
fi
prefix=()
[ "$mode" = --quick ] && prefix=(--prefix)
dev/compare_logs "$out/run/log.jsonl" "$reference" "${prefix[@]}"
ok=$?
./plot_log "$out/run/log.jsonl" -r "$reference" --ref-label "committed reference" -o "$out/run/plot.svg" --baselines none \
    --title "CPU reference run against the committed curve"
exit $ok
