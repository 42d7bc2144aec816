#!/usr/bin/env bash
# dev/run_gpt2_124M.sh: GPT-2 (124M) on FineWeb's 10B-token sample on one
# 8-GPU box, with llm.c's recipe (its scripts/run_gpt2_124M.sh) unchanged:
# the same flags mean the same here (doc/llmc.md). Shards as prepare_data
# writes them (doc/reproducing.md); HellaSwag's eval file as
# `./prepare_data hellaswag` writes it.
#
#   DATA=data/fineweb10B OUT=log124M NP=8 ./dev/run_gpt2_124M.sh
#
# The retry loop is keyed on our checkpoints: every run starts with -y 1,
# so after a crash, a kill or a lost node the next run resumes from the
# newest sealed checkpoint in $OUT (every -n 5000 steps; the last one at the
# end). It stops when a run ends well (exit 0), and does not retry a usage
# error (exit 2: a bad flag or a bad file never fixes itself).
set -u
cd "$(dirname "$0")/.."
DATA=${DATA:-data/fineweb10B}
OUT=${OUT:-log124M}
NP=${NP:-8}
[ -x ./train_gpt2cu ] || { echo "run_gpt2_124M: no ./train_gpt2cu; run make on the GPU machine first"; exit 1; }
ls "$DATA"/fineweb_train_*.bin > /dev/null 2>&1 || { echo "run_gpt2_124M: no $DATA/fineweb_train_*.bin"; exit 1; }
while true; do
    ./train_gpt2cu -np "$NP" \
        -i "$DATA/fineweb_train_*.bin" -j "$DATA/fineweb_val_*.bin" -o "$OUT" \
        -v 250 -s 20000 -g 144 -h 1 -b 64 -t 1024 -d 524288 -r 0 -z 1 -c 0.1 -l 0.0006 -q 0.0 -u 700 \
        -n 5000 -y 1 -e d12
    rc=$?
    [ $rc -eq 0 ] && break
    [ $rc -eq 2 ] && { echo "run_gpt2_124M: usage error (exit 2): not retrying"; exit 2; }
    echo "run_gpt2_124M: the run ended with exit $rc; resuming from the newest checkpoint in $OUT in 10 s"
    sleep 10
done
./plot_log "$OUT/log.jsonl" -o "$OUT/plot.svg" && echo "run_gpt2_124M: done; the curves: $OUT/plot.svg"
