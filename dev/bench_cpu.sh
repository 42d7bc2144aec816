#!/usr/bin/env bash
# CPU trainer benchmark: GPT-2 124M (d12) and the small model of `make run`
# (L=4, C=128, NH=4, GPT-2 vocabulary), B=4, T=64, on $THREADS threads
# (default: all cores). For each: ms/step, tokens/s, GFLOP/s (6 x parameters
# per token + attention, the trainer's count) and the percentage of the FMA
# peak, which dev/bench_kernels measures in the same run, before, between and
# after the models (the highest; a line says when they differ by more than
# 20%, as on a busy machine). Then, when `torch` can be imported ($PYTHON, default
# python3), the same models, settings and thread count in PyTorch eager
# (dev/train_gpt2.py --bench) and the ratio of the step times; otherwise a
# line saying it skipped. Steps: $STEPS (default 8), the first left out of
# the best and median and shown on its own. Last, the matmuls alone at d12's
# shapes (dev/bench_matmul), and beside each, when `torch` imports, PyTorch's
# own matmul at the same shape and threads (dev/bench_matmul_torch.py: MKL in
# the usual x86 builds), both as shares of bench_matmul's peak.
#
# The machine may be shared: each figure is the best step and the median
# step, and the peak is the best of its runs, so compare figures of one run.
set -eu
cd "$(dirname "$0")/.."
steps=${STEPS:-8}
threads=${THREADS:-$(nproc)}
python=${PYTHON:-python3}
trainer=${TRAINER:-./train_gpt2}  # another build of the trainer, to compare before and after
data=${LLM3D_DATA:-../shared/data}
dir=dev/data/tinyshakespeare
for prog in train_gpt2 prepare_data dev/bench_kernels dev/bench_matmul; do
    [ -x $prog ] || { echo "bench_cpu: no ./$prog; run 'make' first"; exit 1; }
done
if ! ls $dir/tiny_shakespeare_train_*.bin >/dev/null 2>&1; then
    [ -f "$data/tinyshakespeare.txt" ] || { echo "bench_cpu: no $data/tinyshakespeare.txt; run 'make run' first"; exit 1; }
    ./prepare_data -i "$data/tinyshakespeare.txt" -o $dir -n tiny_shakespeare >/dev/null
fi
export OMP_NUM_THREADS=$threads
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# the peak before, between and after the runs: on a shared machine other
# tenants' work on the same cores lowers it for a while, and a low peak
# would flatter the trainer, so the highest counts
peak() {
    local p
    p=$(./dev/bench_kernels peak | sed -nE 's/fma peak ([0-9.]+) GFLOP.*/\1/p')
    [[ $p =~ ^[0-9]+(\.[0-9]+)?$ ]] || { echo "bench_cpu: dev/bench_kernels peak gave no FMA peak" >&2; exit 1; }
    echo "$p"
}
peaks=$(peak)

# name, then the trainer's model flags and dev/train_gpt2.py's
models=("d12|-e d12|--init d12" "small|-e d4 -ec 128|--init d4 --n-embd 128")
for m in "${models[@]}"; do
    IFS='|' read -r name cflags _ <<<"$m"
    # shellcheck disable=SC2086
    $trainer $cflags -b 4 -t 64 -x "$steps" -v 0 -s 0 -th "$threads" \
        -i "$dir/tiny_shakespeare_train_*.bin" > "$tmp/$name.txt"
    peaks="$peaks $(peak)"
done
peak=$(echo "$peaks" | awk '{ m = $1; for (i = 2; i <= NF; i++) if ($i > m) m = $i; print m }')
echo "FMA peak: $peak GFLOP/s on $threads threads (the highest of $peaks)"
echo "$peaks" | awk '{ lo = hi = $1; for (i = 2; i <= NF; i++) { if ($i < lo) lo = $i; if ($i > hi) hi = $i }
    if (hi > 1.2 * lo) printf("bench_cpu: the peaks differ by %.0f%%: the machine was busy, and the shares of the peak below may be off\n", 100 * (hi / lo - 1)) }'
printf "%-6s | %9s %9s | %8s %8s | %8s | %9s\n" model "best ms" "median ms" "tok/s" "GFLOP/s" "% peak" "first ms"
for m in "${models[@]}"; do
    IFS='|' read -r name _ _ <<<"$m"
    # step lines: "step N/M | loss | norm | lr | X ms | Y tok/s | Z GFLOP/s | ETA | MFU"; the first one warms up and
    # is shown apart: it maps the memory the later steps reuse
    steps_ms() { grep '^step' "$tmp/$name.txt" | sed -E 's/.*\| ([0-9.]+) ms \| ([0-9]+) tok\/s \| ([0-9.]+) GFLOP.*/\1 \2 \3/'; }
    first=$(steps_ms | head -n 1 | awk '{ print $1 }')
    steps_ms | tail -n +2 | sort -n | awk -v name="$name" -v peak="$peak" -v first="$first" '{ ms[NR] = $1; tok[NR] = $2; gf[NR] = $3 }
            END { if (NR == 0) { print name ": no steps"; exit 1 }
                  printf("%-6s | %9.1f %9.1f | %8.0f %8.1f | %7.1f%% | %9.1f\n", name, ms[1], ms[int((NR + 1) / 2)],
                         tok[1], gf[1], 100 * gf[1] / peak, first) }' | tee "$tmp/$name.c"
done

have_torch=1
if ! "$python" -c 'import torch' 2>/dev/null; then
    echo "PyTorch: skipped, $python cannot import torch (pip install torch numpy)"
    have_torch=0
fi
if [ "$have_torch" = 1 ]; then
    echo "PyTorch $("$python" -c 'import torch; print(torch.__version__)') eager, $threads threads, same models and settings (random tokens):"
fi
for m in "${models[@]}"; do
    [ "$have_torch" = 1 ] || break
    IFS='|' read -r name _ pflags <<<"$m"
    # shellcheck disable=SC2086
    "$python" dev/train_gpt2.py $pflags -B 4 -T 64 --steps "$steps" --bench --bench-warmup 1 --lr 3e-4 \
        > "$tmp/$name.torch.txt"
    # best and median of the steps after the first, as for the trainer
    grep '^step' "$tmp/$name.torch.txt" | tail -n +2 | sed -E 's/.* ms ([0-9.]+) .*/\1/' | sort -n |
        awk -v name="$name" -v c="$(awk '{ print $3 }' "$tmp/$name.c")" '{ ms[NR] = $1 }
            END { printf("%-6s | PyTorch best %.1f ms, median %.1f ms | trainer best %.1f ms | PyTorch / trainer = %.2f\n",
                         name, ms[1], ms[int((NR + 1) / 2)], c, ms[1] / c) }'
done

# the matmuls alone: bench_matmul's table, with PyTorch's figures for the same
# product on its right when there are any (its lines: shape product best median)
echo "The matmuls alone, $threads threads (dev/bench_matmul; torch: dev/bench_matmul_torch.py, best, % of the same peak, median):"
./dev/bench_matmul > "$tmp/mm.txt"
: > "$tmp/mm.torch.txt"
if [ "$have_torch" = 1 ] && ! "$python" dev/bench_matmul_torch.py > "$tmp/mm.torch.txt"; then
    echo "bench_cpu: dev/bench_matmul_torch.py failed; the table has our figures only" >&2
    : > "$tmp/mm.torch.txt"
fi
awk -v torch="$tmp/mm.torch.txt" '
    BEGIN { while ((getline line < torch) > 0) if (split(line, f, " ") == 4) { best[f[1] " " f[2]] = f[3]; med[f[1] " " f[2]] = f[4]; n++ } }
    /FMA peak/ { match($0, /FMA peak [0-9.]+/); peak = substr($0, RSTART + 9, RLENGTH - 9) }
    /^shape/ && n > 0 { width = length($0); printf("%s | %7s %7s %7s %6s\n", $0, "torch", "% peak", "(median)", "/ ours"); next }
    /^N=/ { N = substr($1, 3) + 0 }
    /^[a-z]+ +[0-9]+ +[0-9]+ \|/ { shape = $1; IC = $2; OC = $3 }
    /^ +[0-9]+ +[0-9]+ \|/ { IC = $1; OC = $2 }
    / \| (forward|dinp|dweight) / {
        for (i = 1; i <= NF; i++) if ($i == "forward" || $i == "dinp" || $i == "dweight") { product = $i; ours = $(i + 1) }
        key = shape " " product
        if ((key in best) && peak + 0 > 0) {
            printf("%s | %7.1f %5.1f%% %7.1f %5.2fx\n", sprintf("%-" width "s", $0), best[key], 100 * best[key] / peak,
                   med[key], best[key] / ours)
            # weighed as bench_matmul weighs its own last line: 12 layers and the logits
            flops = 2.0 * N * IC * OC * (shape == "logits" ? 1 : 12)
            step_flops += flops
            step_s += flops / (med[key] * 1e9)
            next
        }
    }
    { print }
    END { if (step_s > 0) printf("torch, the same weighing (medians): %.0f ms, %.1f GFLOP/s, %.1f%% of peak\n", 1e3 * step_s,
                                 step_flops / step_s * 1e-9, 100 * step_flops / step_s * 1e-9 / peak) }' "$tmp/mm.txt"
