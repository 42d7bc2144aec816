#!/usr/bin/env bash
# dev/gpu_check.sh: the whole GPU check in one run, for a machine with an
# NVIDIA GPU (written for one H200: CUDA, PyTorch, no network).
#
#   1. builds train_gpt2cu, test_gpt2cu (bf16 and fp32) and the kernel checks,
#      for this GPU's architecture only (CI compiles sm_80 + sm_90)
#   2. runs test_gpt2cu in both precisions and every dev/cuda check
#   3. benchmarks GPT-2 124M (d12), T = 1024, the largest B of 64/32/16/8 that
#      fits, 30 steps on a random-token shard it writes itself: ms/step,
#      tokens/s, MFU; then the PyTorch peer (dev/train_gpt2.py, torch.compile,
#      bf16 autocast) at the same B, and ours again with -fa 0 (attention
#      on CUDA cores instead of tensor cores)
#   4. writes everything under $OUT (default /tmp/llm3d_gpu_check) and ends
#      with summary.txt
#
# Every piece runs under `timeout`; the whole run stays within DEADLINE
# seconds (default 480): a piece that would start after it is skipped and
# said so. Exit status: 0 if every test and check passed, 1 otherwise.
# Run from anywhere: ./dev/gpu_check.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/llm3d_gpu_check}
DEADLINE=${DEADLINE:-480}
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
START=$(date +%s)
FAILED=0

say() { echo "$@" | tee -a "$SUMMARY"; }
elapsed() { echo $(( $(date +%s) - START )); }

# run NAME LIMIT CMD...: CMD with its output in $OUT/NAME.log, under
# timeout min(LIMIT, what is left of DEADLINE); records pass/fail
run() {
    local name=$1 limit=$2; shift 2
    local left=$(( DEADLINE - $(elapsed) ))
    if [ "$left" -lt 10 ]; then
        say "SKIP  $name: past the ${DEADLINE}s deadline"
        FAILED=1
        return 1
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    local t0=$(date +%s)
    timeout -k 5 "$limit" "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    local secs=$(( $(date +%s) - t0 ))
    local tail_line
    tail_line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$OUT/$name.log" | tail -n 1)
    if [ $rc -eq 0 ]; then
        say "ok    $name (${secs}s) ${tail_line}"
    else
        [ $rc -eq 124 ] && tail_line="timed out after ${limit}s"
        say "FAIL  $name (rc $rc, ${secs}s) ${tail_line}"
    fi
    return $rc
}

say "== llm3d gpu_check $(date -u +%Y-%m-%dT%H:%M:%SZ)"
nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader 2>/dev/null | tee -a "$SUMMARY"
nvcc --version | tail -n 2 >> "$SUMMARY"
CC=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' .')
[ -z "$CC" ] && CC=90
ARCH="-gencode arch=compute_${CC},code=sm_${CC}"
NVCC="nvcc -O3 -std=c++17 $ARCH -DLLM3D_NCCL"
LIBS="-lcublas -lcublasLt -lnccl"

# ---------------------------------------------------------------------------
# 1. build, all at once (16 cores)
say "== build ($ARCH)"
build() {  # build NAME CMD...: in the background, log in $OUT/build_NAME.log
    local name=$1; shift
    ( timeout -k 5 240 "$@" > "$OUT/build_$name.log" 2>&1; echo $? > "$OUT/build_$name.rc" ) &
}
build train_gpt2cu $NVCC train_gpt2.cu $LIBS -o train_gpt2cu
build test_gpt2cu $NVCC test_gpt2.cu $LIBS -o test_gpt2cu
build test_gpt2cu_fp32 $NVCC -DENABLE_FP32 test_gpt2.cu $LIBS -o test_gpt2cu_fp32
build train_gpt2cu_fp32 $NVCC -DENABLE_FP32 train_gpt2.cu $LIBS -o train_gpt2cu_fp32
build kernels make -C dev/cuda -j8 ARCH="$ARCH"
build kernels_fp32 make -C dev/cuda -j8 ARCH="$ARCH" PRECISION=FP32
build cpu make -j4 train_gpt2 prepare_data
wait
for f in "$OUT"/build_*.rc; do
    name=$(basename "$f" .rc); name=${name#build_}
    if [ "$(cat "$f")" = "0" ]; then say "ok    build $name"; else say "FAIL  build $name (see build_$name.log)"; FAILED=1; fi
done
say "   build done at $(elapsed)s"

# ---------------------------------------------------------------------------
# 2. tests and kernel checks
say "== tests"
if [ -x ./test_gpt2cu ]; then run test_gpt2cu 120 ./test_gpt2cu || FAILED=1; fi
if [ -x ./test_gpt2cu_fp32 ]; then run test_gpt2cu_fp32 120 ./test_gpt2cu_fp32 || FAILED=1; fi
for k in encoder layernorm attention classifier adamw gelu matmul; do
    if [ -x "dev/cuda/${k}_check" ]; then run "${k}_check" 90 "dev/cuda/${k}_check" || FAILED=1; fi
done
# the chunked MAC kernels against the CPU construction, and their GB/s (precision plays no part: bf16 build only)
if [ -x dev/cuda/mac_check ]; then run mac_check 90 dev/cuda/mac_check || FAILED=1; fi
grep -h '^time ' "$OUT"/*_check.log >> "$SUMMARY" 2>/dev/null

# ---------------------------------------------------------------------------
# 2b. the parallel layouts through NCCL (nccl_comm.h's NCCL backend). -np 1
# always: the one-rank NCCL path (init, splits) under ZeRO 0-3, whose losses
# must agree (bit for bit in fp32); -np 2 (dp, tp, pp), a stalled rank's
# watchdog line and a tampered pipeline message only with a second GPU.
say "== data parallel through NCCL"
DP_DIR=/tmp/llm3d_dp_shards
mkdir -p "$DP_DIR"
python3 - "$DP_DIR/dp_train_000.bin" <<'EOF'
import array, struct, sys
n = 4 * 64 * 64 + 1  # a learnable stream: each token determines the next
tokens = array.array("H", ((i * 7919 + 13) % 512 for i in range(n)))
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
    f.write(tokens.tobytes())
EOF
DP_RUN="./train_gpt2cu -e d2 -ev 512 -et 64 -t 64 -b 4 -x 8 -l 1e-3 -v 4 -m 2 -s 0 -i $DP_DIR/dp_train_*.bin -j $DP_DIR/dp_train_*.bin"
# dp_compare BOUND REF LOG...: every log's losses within BOUND of REF's, and REF learns
dp_compare() {
    python3 - "$@" <<'EOF' | tee -a "$SUMMARY"
import json, sys
bound, ref_path, paths = float(sys.argv[1]), sys.argv[2], sys.argv[3:]
loss = lambda p: [json.loads(l)["loss"] for l in open(p)]
ref, ok = loss(ref_path), True
print(f"   {ref_path}: loss {ref[0]:.4f} -> {ref[-1]:.4f}")
ok = ref[-1] < ref[0]
for p in paths:
    got = loss(p)
    worst = max(abs(a - b) for a, b in zip(ref, got)) if len(got) == len(ref) else float("inf")
    print(f"   {p}: {len(got)} steps, largest loss difference {worst:.2e} (bound {bound})")
    ok = ok and worst <= bound
print("ok    losses agree" if ok else "FAIL  losses disagree (or did not fall)")
sys.exit(0 if ok else 1)
EOF
    return "${PIPESTATUS[0]}"
}
if [ -x ./train_gpt2cu ]; then
    run dp_np1_z0 60 $DP_RUN -np 1 -z 0 -lg "$OUT/dp_np1_z0.jsonl" &&
    run dp_np1_z1 60 $DP_RUN -np 1 -z 1 -lg "$OUT/dp_np1_z1.jsonl" &&
    run dp_np1_z2 60 $DP_RUN -np 1 -z 2 -lg "$OUT/dp_np1_z2.jsonl" &&
    run dp_np1_z3 60 $DP_RUN -np 1 -z 3 -lg "$OUT/dp_np1_z3.jsonl" &&
    run dp_np1_accum2 60 $DP_RUN -np 1 -d 512 -lg "$OUT/dp_np1_accum2.jsonl" &&
    dp_compare 1e-2 "$OUT/dp_np1_z0.jsonl" "$OUT/dp_np1_z1.jsonl" "$OUT/dp_np1_z2.jsonl" "$OUT/dp_np1_z3.jsonl" || FAILED=1
    # the fp32 build: with one micro-batch per step every ZeRO stage of one
    # rank does the same arithmetic (buckets start at zero), so bit for bit
    if [ -x ./train_gpt2cu_fp32 ]; then
        for z in 0 1 2 3; do
            run dp32_z$z 60 ${DP_RUN/.\/train_gpt2cu/.\/train_gpt2cu_fp32} -z $z -lg "$OUT/dp32_z$z.jsonl" || FAILED=1
        done
        dp_compare 0 "$OUT/dp32_z0.jsonl" "$OUT/dp32_z1.jsonl" "$OUT/dp32_z2.jsonl" "$OUT/dp32_z3.jsonl" || FAILED=1
    fi
    NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
    if [ "$NGPU" -ge 2 ]; then
        run dp_np2_z0 90 $DP_RUN -np 2 -z 0 -lg "$OUT/dp_np2_z0.jsonl" &&
        run dp_np2_z1 90 $DP_RUN -np 2 -z 1 -ck 2 -lg "$OUT/dp_np2_z1.jsonl" &&
        dp_compare 2e-2 "$OUT/dp_np1_accum2.jsonl" "$OUT/dp_np2_z0.jsonl" "$OUT/dp_np2_z1.jsonl" || FAILED=1
        # rank 1 stops answering at step 3: rank 0's watchdog must end the job with one line
        timeout -k 5 60 $DP_RUN -np 2 -to 5 -fault stall:1:3 > "$OUT/dp_np2_stall.log" 2>&1
        rc=$?
        if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "nccl .*(step 3): timeout after" "$OUT/dp_np2_stall.log"; then
            say "ok    dp_np2_stall: $(grep -m1 'timeout after' "$OUT/dp_np2_stall.log")"
        else
            say "FAIL  dp_np2_stall (rc $rc): no watchdog line (see dp_np2_stall.log)"
            FAILED=1
        fi
        # tensor and pipeline parallel on two GPUs, the same global batch as one rank
        run tp2 90 $DP_RUN -np 2 -tp 2 -lg "$OUT/tp2.jsonl" &&
        run pp2_1f1b 90 $DP_RUN -np 2 -pp 2 -d 512 -ps 1f1b -lg "$OUT/pp2_1f1b.jsonl" &&
        run pp2_gpipe_z3 90 $DP_RUN -np 2 -pp 2 -d 512 -ps gpipe -z 3 -lg "$OUT/pp2_gpipe_z3.jsonl" &&
        dp_compare 2e-2 "$OUT/dp_np1_z0.jsonl" "$OUT/tp2.jsonl" &&
        dp_compare 2e-2 "$OUT/dp_np1_accum2.jsonl" "$OUT/pp2_1f1b.jsonl" "$OUT/pp2_gpipe_z3.jsonl" || FAILED=1
        # a tampered activation: the receiver's MAC check ends the job before the update
        timeout -k 5 60 $DP_RUN -np 2 -pp 2 -d 512 -fault tamper:0:2 > "$OUT/pp2_tamper.log" 2>&1
        rc=$?
        if [ $rc -eq 1 ] && grep -q "does not verify" "$OUT/pp2_tamper.log"; then
            say "ok    pp2_tamper: $(grep -m1 'does not verify' "$OUT/pp2_tamper.log")"
        else
            say "FAIL  pp2_tamper (rc $rc): no MAC failure line (see pp2_tamper.log)"
            FAILED=1
        fi
    else
        say "SKIP  -np 2 through NCCL (dp, tp, pp, the stall and tamper faults): $NGPU GPU(s) here"
    fi
fi

# ---------------------------------------------------------------------------
# 2c. checkpoints (on the 2b shard). (a) 20 steps with -n 10, then a copy of
# step 10's checkpoint resumed to 20: the same printed losses and norms, and
# byte-identical checkpoints of step 20. (b) SIGTERM: finish the step,
# checkpoint, exit 0. (c) across the trainers, fp32 GPU build: the CPU
# trainer resumes the GPU's step 10 and the GPU the CPU's; the loss of step
# 10 (a forward on the same weights and batch) agrees within 2e-5: each
# trainer's fp32 loss is within 1e-5 of PyTorch's (test_gpt2, test_gpt2cu_fp32).
say "== checkpoints"
CK=/tmp/llm3d_ckpt  # not under $OUT: nothing big comes back
rm -rf "$CK"; mkdir -p "$CK/resumed"
CK_RUN="-e d2 -ev 512 -et 64 -t 64 -b 4 -l 1e-3 -v 0 -s 0 -i $DP_DIR/dp_train_*.bin"
# ck_compare BOUND REF GOT: each step GOT logs, REF logs with a loss within
# BOUND (0: the same printed loss and norm)
ck_compare() {
    python3 - "$@" <<'EOF' | tee -a "$SUMMARY"
import json, sys
bound, ref_path, got_path = float(sys.argv[1]), sys.argv[2], sys.argv[3]
rows = lambda p: {r["step"]: r for r in map(json.loads, open(p))}
ref, got = rows(ref_path), rows(got_path)
ok = len(got) > 0 and all(s in ref for s in got)
worst = max((abs(ref[s]["loss"] - got[s]["loss"]) for s in got if s in ref), default=float("inf"))
if bound == 0: ok = ok and all((ref[s]["loss"], ref[s]["norm"]) == (got[s]["loss"], got[s]["norm"]) for s in got)
else: ok = ok and worst <= bound
print(f"{'ok   ' if ok else 'FAIL '} {got_path}: steps {min(got, default=-1)}-{max(got, default=-1)} against {ref_path}: "
      f"largest loss difference {worst:.2e} (bound {bound:g})")
sys.exit(0 if ok else 1)
EOF
    return "${PIPESTATUS[0]}"
}
if [ -x ./train_gpt2cu ]; then
    run ck_full 60 ./train_gpt2cu $CK_RUN -x 20 -n 10 -o "$CK/full" -lg "$OUT/ck_full.jsonl" &&
    cp -r "$CK/full/ckpt_00000010" "$CK/full/job.key" "$CK/resumed/" &&
    run ck_resumed 60 ./train_gpt2cu $CK_RUN -x 20 -n 10 -o "$CK/resumed" -y 1 -lg "$OUT/ck_resumed.jsonl" &&
    grep -q "resuming from .*ckpt_00000010: step 10" "$OUT/ck_resumed.log" &&
    ck_compare 0 "$OUT/ck_full.jsonl" "$OUT/ck_resumed.jsonl" &&
    cmp "$CK/full/ckpt_00000020/model.bin" "$CK/resumed/ckpt_00000020/model.bin" &&
    cmp "$CK/full/ckpt_00000020/optim.bin" "$CK/resumed/ckpt_00000020/optim.bin" &&
    say "ok    step 20's model.bin and optim.bin byte-identical, uninterrupted and resumed" || FAILED=1
    grep -h "^checkpoint .* written in" "$OUT/ck_full.log" | tail -n 1 | sed 's/^/   d2: /' | tee -a "$SUMMARY"
    # SIGTERM once the run is under way: it finishes the step, checkpoints and exits 0
    timeout -k 5 120 ./train_gpt2cu $CK_RUN -x 100000 -o "$CK/term" > "$OUT/ck_term.log" 2>&1 &  # timeout passes the TERM on
    pid=$!
    for _ in $(seq 100); do grep -q "^step  *5/" "$OUT/ck_term.log" && break; sleep 0.2; done
    kill -TERM $pid; wait $pid; rc=$?
    if [ $rc -eq 0 ] && grep -q "stopped by a signal after step" "$OUT/ck_term.log" && ls -d "$CK"/term/ckpt_* > /dev/null 2>&1; then
        say "ok    SIGTERM: $(grep -m1 'stopped by a signal' "$OUT/ck_term.log"), $(basename "$(ls -d "$CK"/term/ckpt_* | tail -n 1)") written"
    else
        say "FAIL  SIGTERM: exit $rc (see ck_term.log)"; FAILED=1
    fi
    if [ -x ./train_gpt2cu_fp32 ] && [ -x ./train_gpt2 ]; then
        run ck_gpu32 60 ./train_gpt2cu_fp32 $CK_RUN -x 11 -n 10 -o "$CK/g32" -lg "$OUT/ck_gpu32.jsonl" &&
        run ck_gpu32_on_cpu 120 ./train_gpt2 $CK_RUN -x 11 -ys 10 -o "$CK/g32" -lg "$OUT/ck_gpu32_on_cpu.jsonl" &&
        ck_compare 2e-5 "$OUT/ck_gpu32.jsonl" "$OUT/ck_gpu32_on_cpu.jsonl" || FAILED=1
        run ck_cpu 120 ./train_gpt2 $CK_RUN -x 11 -n 10 -o "$CK/cpu" -lg "$OUT/ck_cpu.jsonl" &&
        run ck_cpu_on_gpu32 60 ./train_gpt2cu_fp32 $CK_RUN -x 11 -ys 10 -o "$CK/cpu" -lg "$OUT/ck_cpu_on_gpu32.jsonl" &&
        ck_compare 2e-5 "$OUT/ck_cpu.jsonl" "$OUT/ck_cpu_on_gpu32.jsonl" || FAILED=1
    fi
fi
rm -rf "$CK" "$DP_DIR"

# ---------------------------------------------------------------------------
# 3. the benchmark: our trainer, then PyTorch at the same B
say "== benchmark: d12, T = 1024, 30 steps, random tokens"
SHARDS=/tmp/llm3d_bench_shards  # not under $OUT: nothing big comes back
mkdir -p "$SHARDS"
python3 - "$SHARDS/bench_train_000.bin" <<'EOF'
import array, random, struct, sys
n = 64 * 1024 * 32 + 1  # 32 windows at B = 64, more at smaller B
rng = random.Random(1337)
tokens = array.array("H", (rng.randrange(50257) for _ in range(n)))
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
    f.write(tokens.tobytes())
EOF

BENCH_B=""
if [ -x ./train_gpt2cu ]; then
    for B in 64 32 16 8; do
        if run "bench_B$B" 150 ./train_gpt2cu -e d12 -b $B -t 1024 -x 30 -v 0 -s 0 \
               -i "$SHARDS/bench_train_*.bin" -lg "$OUT/bench_B$B.jsonl"; then
            BENCH_B=$B
            break
        fi
        grep -q "out of GPU memory" "$OUT/bench_B$B.log" || break  # only memory is worth a smaller B
    done
fi
if [ -n "$BENCH_B" ]; then
    python3 - "$OUT/bench_B$BENCH_B.jsonl" "$OUT/bench_B$BENCH_B.log" <<'EOF' | tee -a "$SUMMARY"
import json, re, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
ms = statistics.median(r["ms"] for r in rows[3:])  # steps 0-2 warm cuBLASLt up
tokens = rows[0]["tokens"]
mfu = [float(m) for m in re.findall(r"\| MFU ([0-9.]+)%", open(sys.argv[2]).read())[3:]]
mfu_s = f"{statistics.median(mfu):.1f}%" if mfu else "n/a"
print(f"train_gpt2cu: ms/step {ms:.2f} tokens/s {tokens / ms * 1000:.0f} MFU {mfu_s} "
      f"(B*T = {tokens}, median of steps 3-{len(rows) - 1}; loss {rows[0]['loss']:.3f} -> {rows[-1]['loss']:.3f})")
EOF
    run torch_bench 300 python3 dev/train_gpt2.py --bench --device cuda --compile --dtype-train bf16 \
        -B "$BENCH_B" -T 1024 --init d12 --steps 30
    grep -h '^bench:' "$OUT/torch_bench.log" | sed 's/^/pytorch (torch.compile, bf16) /' | tee -a "$SUMMARY"
else
    say "FAIL  no benchmark: train_gpt2cu did not run at any B (see bench_B*.log)"
    FAILED=1
fi

# the same run with the fp32-FMA attention, to see what the tensor cores buy
if [ -n "$BENCH_B" ]; then
    run "bench_B${BENCH_B}_fa0" 120 ./train_gpt2cu -e d12 -b "$BENCH_B" -t 1024 -x 12 -v 0 -s 0 -fa 0 \
        -i "$SHARDS/bench_train_*.bin" -lg "$OUT/bench_fa0.jsonl" &&
    python3 - "$OUT/bench_fa0.jsonl" <<'EOF' | tee -a "$SUMMARY"
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
ms = statistics.median(r["ms"] for r in rows[3:])
print(f"train_gpt2cu -fa 0: ms/step {ms:.2f} tokens/s {rows[0]['tokens'] / ms * 1000:.0f}")
EOF
fi

# the fp32 kernel checks last: worth having, not worth the benchmark's place
say "== fp32 kernel checks"
for k in encoder layernorm attention classifier adamw gelu matmul; do
    if [ -x "dev/cuda/${k}_fp32_check" ]; then run "${k}_fp32_check" 60 "dev/cuda/${k}_fp32_check" || FAILED=1; fi
done

rm -rf "$SHARDS"
say "== done in $(elapsed)s: $([ $FAILED -eq 0 ] && echo 'all passed' || echo 'SOMETHING FAILED')"
exit $FAILED
