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
# end). It stops when a run ends well (exit 0), does not retry a usage
# error (exit 2: a bad flag or a bad file never fixes itself), and gives up
# after 3 failed runs in a row that wrote no new checkpoint: a failure that
# persists (a full disk, another job's key in $OUT) would otherwise restart
# every 10 s forever.
set -u
cd "$(dirname "$0")/.."
DATA=${DATA:-data/fineweb10B}
OUT=${OUT:-log124M}
NP=${NP:-8}
[ -x ./train_gpt2cu ] || { echo "run_gpt2_124M: no ./train_gpt2cu; run make on the GPU machine first"; exit 1; }
ls "$DATA"/fineweb_train_*.bin > /dev/null 2>&1 || { echo "run_gpt2_124M: no $DATA/fineweb_train_*.bin"; exit 1; }
newest() { ls -d "$OUT"/ckpt_[0-9]* 2>/dev/null | grep -v '\.partial$' | sort | tail -n 1; }
stuck=0
while true; do
    before=$(newest)
    ./train_gpt2cu -np "$NP" \
        -i "$DATA/fineweb_train_*.bin" -j "$DATA/fineweb_val_*.bin" -o "$OUT" \
        -v 250 -s 20000 -g 144 -h 1 -b 64 -t 1024 -d 524288 -r 0 -z 1 -c 0.1 -l 0.0006 -q 0.0 -u 700 \
        -n 5000 -y 1 -e d12
    rc=$?
    [ $rc -eq 0 ] && break
    [ $rc -eq 2 ] && { echo "run_gpt2_124M: usage error (exit 2): not retrying"; exit 2; }
    if [ "$(newest)" = "$before" ]; then stuck=$((stuck + 1)); else stuck=0; fi
    if [ $stuck -ge 3 ]; then
        echo "run_gpt2_124M: 3 runs in a row ended with an error (the last exit $rc) and no new checkpoint in $OUT:" \
            "not retrying; the runs' lines above say why"
        exit $rc
    fi
    echo "run_gpt2_124M: the run ended with exit $rc; resuming from the newest checkpoint in $OUT in 10 s"
    sleep 10
done
./plot_log "$OUT/log.jsonl" -o "$OUT/plot.svg" && echo "run_gpt2_124M: done; the curves: $OUT/plot.svg"
