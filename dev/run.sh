#!/usr/bin/env bash
# make run: the quick start. Finds tinyshakespeare and the GPT-2 BPE files in
# $LLM3D_DATA (default ../shared/data), else downloads them and checks their
# SHA-256; with neither, trains on the project's own sources with byte-level
# tokens (vocab 256). Then prepares shards and trains a small model for a few
# minutes on this machine's cores, printing val loss and a sample, and last
# draws the run's log as an SVG (plot_log) and says where it is.
# For the tests: LLM3D_QUICKSTART moves dev/data/quickstart, LLM3D_NO_FETCH=1
# keeps it off the network.
set -u
cd "$(dirname "$0")/.."
data=${LLM3D_DATA:-../shared/data}
out=${LLM3D_QUICKSTART:-dev/data/quickstart}
mkdir -p "$out"
fetch() {  # fetch URL FILE SHA256
    [ "${LLM3D_NO_FETCH:-0}" = 1 ] && return 1
    command -v curl >/dev/null || return 1
    curl -fsSL --max-time 60 "$1" -o "$2.tmp" 2>/dev/null || { rm -f "$2.tmp"; return 1; }
    echo "$3  $2.tmp" | sha256sum -c --quiet - 2>/dev/null || { echo "run: $1: SHA-256 mismatch"; rm -f "$2.tmp"; return 1; }
    mv "$2.tmp" "$2"
}
text=$data/tinyshakespeare.txt enc=$data/gpt2/encoder.json bpe=$data/gpt2/vocab.bpe
if [ ! -f "$text" ] || [ ! -f "$enc" ] || [ ! -f "$bpe" ]; then
    text=$out/tinyshakespeare.txt enc=$out/encoder.json bpe=$out/vocab.bpe
    [ -f "$text" ] || fetch https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt "$text" \
        86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed
    [ -f "$enc" ] || fetch https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/encoder.json "$enc" \
        196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783
    [ -f "$bpe" ] || fetch https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/vocab.bpe "$bpe" \
        1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5
fi
if [ -f "$text" ] && [ -f "$enc" ] && [ -f "$bpe" ]; then
    ./prepare_data -i "$text" -o "$out" -n tiny --encoder "$enc" --vocab "$bpe" || exit 1
    model="-e d4 -ec 128 -ev 50257 -et 64"
else
    echo "run: no tinyshakespeare.txt, gpt2/encoder.json and gpt2/vocab.bpe in $data (\$LLM3D_DATA, default ../shared/data)" \
        "or $out, and none could be fetched: training on the project's own sources, byte-level tokens"
    cat ./*.c ./*.h llm3d/*.h llm3d/*/*.h README.md doc/*.md > "$out/sources.txt"
    ./prepare_data -i "$out/sources.txt" -o "$out" -n tiny -v 16384 --bytes || exit 1
    model="-e d4 -ec 128 -ev 256 -et 64"
fi
# a few minutes on 2 cores
./train_gpt2 $model -i "$out/tiny_train_*.bin" -j "$out/tiny_val_*.bin" -tk "$out/tiny_tokenizer.bin" \
    -b 4 -t 64 -x ${STEPS:-200} -l 1e-3 -u 20 -q 0.1 -c 0.1 -v 50 -m 8 -s 300 -g 64 -o "$out/run"
rc=$?
# the run's curves, to open in a browser (FineWeb's GPT-2 baselines mean nothing on this data)
[ -f "$out/run/log.jsonl" ] && ./plot_log "$out/run/log.jsonl" -o "$out/run/plot.svg" --baselines none \
    --title "make run ($model)"
exit $rc
