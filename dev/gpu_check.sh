#!/usr/bin/env bash
# dev/gpu_check.sh: the GPU trainer's whole check as one command, made for a
# short slot on one GPU (written for one H200: CUDA, PyTorch, no network).
#
#   ./dev/gpu_check.sh          # OUT=DIR for the results (default /tmp/llm3d_gpu_check)
#   LLMC_DIR=DIR ./dev/gpu_check.sh  # with llm.c's GPU trainer in DIR as a speed peer
#   QUICK=1 ./dev/gpu_check.sh  # for turns on a kernel: phases 0, 1, 3, 4, 10 (no sanitizers) and 12
#
# What it leaves in $OUT is two files, so that it all comes back from a
# machine that returns only a few: summary.txt (also printed as it goes) and
# logs.tar.gz (every log, refreshed after each phase, so a run cut short
# still leaves what it did).
#
# Phases, the most informative first, each timed in the summary:
#   0. preflight (seconds): a GPU, nvcc and NCCL (a system one, or the
#      libnccl.so.2 of a Python wheel such as nvidia-nccl-cu13), else one line
#      and exit 3 before anything is built
#   1. build, all at once, for this GPU's architecture only
#   2. the NCCL probe: can NCCL run 2, 4 and 8 ranks on this one GPU? With
#      -hb 2 each rank is an NCCL node of its own (NCCL_HOSTID), joined by
#      NCCL's network transport; dp 2, 4 and 8 for 4 steps each, with NCCL's
#      version and transport and a step's time. Phases 5 and 6 run their NCCL
#      cases up to the most ranks that ran here (NCCL_RANKS)
#   3. test_gpt2cu (bf16): the trainer against the PyTorch fixtures
#   4. benchmark: GPT-2 124M (d12), T = 1024, 30 steps, random tokens: gates
#      on step 0's loss (near ln 50257) and on its fall; tokens/s and MFU;
#      the checked collectives' cost (-ic 1 against -ic 0, dp 2 over NCCL)
#   5. over real NCCL (-hb 2), the ranks on this one GPU: tamper and replay
#      of a MAC'd pipeline message refused ("does not verify"), kill and
#      stall ending the job with the culprit named, -wr naming a slowed rank
#      from NCCL's wait clocks, -ck a drifted replica, -ic 1 catching and
#      naming -fault corrupt (dp 2 ZeRO-1 and ZeRO-3, tp 2: exit 1, no
#      checkpoint from that step; the -ic 1 layouts below, pp 2 x dp 2 zbv
#      ZeRO-3 among them, show their calls judged), -gp naming -fault
#      poison; then every layout of
#      test_layouts, fp32 within 1e-5 of one rank, a bf16 subset within 2e-2,
#      sequence parallelism (-sp 1) among them: tp 2, tp 4, (2, 2, 2), dp 2 x
#      tp 2 ZeRO-3 and pp 2 x tp 2 interleaved (each layout's line must name
#      the schedule asked for and, with -sp 1, sequence parallelism);
#      the schedules interleaved (-pv 2), zbh1 and zbv at pp 2 and 4
#      (built without a GPU: first run here), zbv pp 2 in bf16 too, and with
#      dp 2 (zbv ZeRO 1 and 3, interleaved ZeRO 2), tp 2 (zbh1) and (2, 2, 2)
#      (zbv, ZeRO 1, -sp 1); and dp 2 ZeRO-1 and tp 2 with -ic 1 (checked
#      collectives: no false alarm); each pipeline layout's bubble measured
#      on the GPU's clock (a line, a share in (0, 1))
#   6. over real NCCL: checkpoints of 8 ranks ((2, 2, 2), ZeRO 1 and 3, fp32;
#      ZeRO-3's sealed, -enc 1) resumed bit for bit by the same layout, by one
#      rank (1e-5) and by the CPU trainer; a 1f1b checkpoint resumed under zbv (1e-5); SIGTERM of an 8-rank job; 2 ranks started by a script,
#      torchrun and mpirun (each where the machine has it), --rendezvous
#   7. the layouts of phase 5 in host mode (the default where ranks share a
#      GPU: they talk through the shared-memory host backend) and the resume
#      across schedules, with their faults, the watch report, the
#      consistency check, -ic 1 and -gp
#   8. fp32: test_gpt2cu_fp32; the GPU against the CPU trainer (10 steps
#      within 1e-4); a checkpoint of each resumed by the other
#   9. NCCL with one rank: ZeRO 0-3 agree (fp32: bit for bit); checkpoints
#      resume byte-identical; sealed checkpoints (-enc 1) give the plain
#      run's losses and resume bit-exact; SIGTERM checkpoints and exits 0
#  10. kernel checks (bf16 and fp32), test_aead on this machine's CPU (its
#      AVX-512 VAES path), then compute-sanitizer memcheck and
#      racecheck over the bf16 ones at small shapes (LLM3D_CHECK_SMALL=1),
#      memcheck over the fp32 ones (the build also gates on ptxas: no kernel
#      may spill)
#  11. the peers at the benchmark's B and T on the same GPU: PyTorch
#      (torch.compile, bf16) and llm.c's train_gpt2cu with cuDNN attention
#      (built from LLMC_DIR, a copy of llm.c; skipped with a line without it):
#      ms per step, tokens/s, peak GPU memory, ours / theirs; ours with -fa 0
#  12. a profile (Nsight Compute): the kernels of two d12 steps at the
#      benchmark's B, their GPU time summed by name; a measurement, not a gate
#  13. the pipeline schedules' bubbles measured by the CPU trainer on this
#      machine's cores (dev/bench_pipeline.sh, pp 4, M 8, one thread a rank):
#      the bars of zbh1, interleaved and zbv against 1f1b's, each within 5
#      points of its simulated value (no 1f1b bubble above 0 fails them); it
#      needs at least 8 cores, which the machines we are lent have and ours
#      does not
#
# Each piece is "ok", "FAIL", or "SKIP" (past the deadline, cut by it to
# less than half its own time limit and timed out there, or something it
# needs is missing): skipped for time is not failed. The whole run keeps to
# DEADLINE seconds (default 420, builds included), and phases 5 and 6 to
# NCCL_UNTIL seconds from the start (default DEADLINE - 140), so that the
# phases after them keep their time. Exit status: 0 when nothing failed, 1
# when something did, 3 when the preflight stopped it.
#
# Cases run side by side, JOBS at once (default 4), and NCCL cases while
# their ranks together stay within RANKS (default 16: each rank is a
# process with its own CUDA context and NCCL's threads, on 16 cores).
# DRYRUN=1 (dev/gpu_check_dryrun.sh sets it): the trainers are stand-ins
# that run the CPU trainer, so a check for a line only NCCL prints looks
# for the host backend's line instead.
#
# bf16 bound: a layout changes the order in which bf16 gradients are summed
# (per tp slice, per pipeline micro-batch, per data-parallel shard), and
# each bf16 rounding is worth up to 2^-8 relative; over 10 steps at lr 1e-3
# the losses of a tiny model (about 6) then move by up to about 1e-2. The
# bound, 2e-2, is twice that; a real fault (a missing all-reduce, a message
# from the wrong micro-batch) moves them by 0.1 or more.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/llm3d_gpu_check}
DEADLINE=${DEADLINE:-420}
NCCL_UNTIL=${NCCL_UNTIL:-$((DEADLINE - 140))}
DRYRUN=${DRYRUN:-0}
# QUICK=1: what a change to a kernel needs, in about a third of the time: the
# builds, the fixtures, the benchmark, the kernel checks (without the
# sanitizers) and the profile; each other phase says it is skipped
QUICK=${QUICK:-0}
case $QUICK in 0|1) ;; *) echo "gpu_check: QUICK=$QUICK: give 0 or 1"; exit 2 ;; esac
mkdir -p "$OUT"
LOGS=$(mktemp -d /tmp/llm3d_gpu_logs.XXXXXX)
WORK=$(mktemp -d /tmp/llm3d_gpu_work.XXXXXX)  # shards, checkpoints: nothing big comes back
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
START=$(date +%s)
NPASS=0 NFAIL=0 NSKIP=0
PHASE="" PHASE_T0=$START

say() { echo "$@" | tee -a "$SUMMARY"; }
elapsed() { echo $(( $(date +%s) - START )); }
archive() { tar czf "$OUT/logs.tar.gz.tmp" -C "$LOGS" . 2>/dev/null && mv "$OUT/logs.tar.gz.tmp" "$OUT/logs.tar.gz"; }
# verdicts; in a case run in the background (VERDICT set) they go to its
# file instead, and collect counts them
pass() { if [ -n "${VERDICT:-}" ]; then echo "ok $*" >> "$VERDICT"; else NPASS=$((NPASS + 1)); say "ok    $*"; fi; }
fail() { if [ -n "${VERDICT:-}" ]; then echo "FAIL $*" >> "$VERDICT"; else NFAIL=$((NFAIL + 1)); say "FAIL  $*"; fi; }
skip() { if [ -n "${VERDICT:-}" ]; then echo "SKIP $*" >> "$VERDICT"; else NSKIP=$((NSKIP + 1)); say "SKIP  $*"; fi; }

# background CMD...: CMD (a function of this script) as one case in the
# background, at most JOBS at once (the small layout runs leave most of the
# GPU and the cores idle, so several share the machine), and with W=N before
# it (an NCCL case of N ranks) while the weights of those running stay
# within RANKS; collect waits for them all and counts their verdicts in the
# order they started
JOBS=${JOBS:-4}
RANKS=${RANKS:-16}
NCASE=0
declare -A CASE_W
background() {
    local w=${W:-1} p running load
    for (( ; ; )); do
        running=0 load=0
        for p in $(jobs -rp); do running=$((running + 1)) load=$((load + ${CASE_W[$p]:-1})); done
        if [ "$running" -lt "$JOBS" ] && { [ $((load + w)) -le "$RANKS" ] || [ "$running" -eq 0 ]; }; then break; fi
        wait -n
    done
    NCASE=$((NCASE + 1))
    ( VERDICT=$(printf '%s/verdict_%04d' "$WORK" "$NCASE"); : > "$VERDICT"; "$@" ) &
    CASE_W[$!]=$w
}
collect() {
    wait
    local f v rest
    for f in "$WORK"/verdict_*; do
        [ -f "$f" ] || continue
        while read -r v rest; do
            case $v in ok) pass "$rest" ;; FAIL) fail "$rest" ;; SKIP) skip "$rest" ;; esac
        done < "$f"
        rm -f "$f"
    done
}

# phase NAME [full]: closes the phase before (its time in the summary), opens
# this one. ON is 1 when it runs: always, but for a "full" phase under QUICK=1
phase() {
    [ -n "$PHASE" ] && say "   ($PHASE: $(( $(date +%s) - PHASE_T0 ))s)"
    archive
    PHASE=$1 PHASE_T0=$(date +%s) ON=1
    [ -n "$PHASE" ] && say "== $PHASE (at $(elapsed)s)"
    if [ "${2:-}" = full ] && [ "$QUICK" = 1 ]; then ON=0; skip "$PHASE: QUICK=1"; fi
}

finish() {
    phase ""
    say "== done in $(elapsed)s: $NPASS passed, $NFAIL failed, $NSKIP skipped"
    archive
    rm -rf "$LOGS" "$WORK"
    [ "$NFAIL" -eq 0 ] && exit 0 || exit 1
}
trap 'say "FAIL  interrupted at $(elapsed)s"; NFAIL=$((NFAIL + 1)); finish' INT TERM

# time_left LIMIT: LIMIT or what is left of the deadline, whichever is less;
# prints nothing (returns 1) when less than 10 s are left
time_left() {
    local left=$(( DEADLINE - $(elapsed) ))
    [ "$left" -lt 10 ] && return 1
    [ "$1" -lt "$left" ] && echo "$1" || echo "$left"
}

# cut_short NAME ASKED LIMIT RC SECS: 0 (and a SKIP for NAME) when a
# command that timeout ended (RC 124 or 137 after SECS >= LIMIT seconds)
# had had its own limit ASKED cut by the deadline to LIMIT, less than half
# of it: a case that did not fit is skipped for time, not failed. Else 1,
# and the caller fails it: a case that ran out of at least half its own
# limit hung (the trainer's watchdog ends a stuck job well within it), and
# a 137 before the limit was a kill of another cause (memory).
cut_short() {
    if { [ "$4" -eq 124 ] || [ "$4" -eq 137 ]; } && [ "$5" -ge "$3" ] && [ $((2 * $3)) -lt "$2" ]; then
        skip "$1: cut short by the ${DEADLINE}s deadline after $3s (its own limit: $2s)"
        return 0
    fi
    return 1
}

# run NAME LIMIT CMD...: CMD with its output in $LOGS/NAME.log under a
# timeout; ok / FAIL / SKIP (for time). Returns CMD's status (77: skipped).
run() {
    local name=$1 asked=$2 limit; shift
    if ! limit=$(time_left "$1"); then skip "$name: past the ${DEADLINE}s deadline"; return 77; fi
    shift
    local t0=$(date +%s)
    timeout -k 5 "$limit" "$@" > "$LOGS/$name.log" 2>&1
    local rc=$? secs=$(( $(date +%s) - t0 ))
    local counts
    counts=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$LOGS/$name.log" | tail -n 1)
    if [ $rc -eq 0 ]; then pass "$name (${secs}s) $counts"
    elif cut_short "$name" "$asked" "$limit" "$rc" "$secs"; then return 77
    elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then fail "$name: timed out after ${limit}s"
    else
        local why
        why=$(grep -v '^ok' "$LOGS/$name.log" | grep -m1 -iE 'fail|error|cannot|not ' | cut -c1-160)
        [ -z "$why" ] && why=$(grep -v '^ *$' "$LOGS/$name.log" | tail -n 1 | cut -c1-160)
        fail "$name (exit $rc, ${secs}s) $counts: $why"
    fi
    return $rc
}

# the GPU's memory in use while a benchmark runs, sampled by nvidia-smi every
# 100 ms: mem_watch NAME starts it, mem_peak NAME stops it and prints the
# peak less what was in use before the start, in MiB ("n/a" without samples)
mem_watch() {
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 2>/dev/null | head -n 1 > "$WORK/mem_$1.base"
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 -lms 100 > "$WORK/mem_$1.csv" 2>/dev/null &
    MEM_PID=$!
}
mem_peak() {
    kill "$MEM_PID" 2>/dev/null; wait "$MEM_PID" 2>/dev/null
    local base peak
    base=$(grep -E '^ *[0-9]+ *$' "$WORK/mem_$1.base" | head -n 1 | tr -d ' ')
    peak=$(grep -E '^ *[0-9]+ *$' "$WORK/mem_$1.csv" | sort -n | tail -n 1 | tr -d ' ')
    if [ -n "$base" ] && [ -n "$peak" ]; then echo "$((peak - base))"; else echo "n/a"; fi
}

# ---------------------------------------------------------------------------
phase "preflight"
if ! command -v nvidia-smi > /dev/null || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
    say "gpu_check: no NVIDIA GPU here (nvidia-smi lists none): nothing to check"
    archive; rm -rf "$LOGS" "$WORK"; exit 3
fi
NVCC_BIN=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
if [ -z "$NVCC_BIN" ]; then
    say "gpu_check: no nvcc on PATH or in /usr/local/cuda/bin: cannot build"
    archive; rm -rf "$LOGS" "$WORK"; exit 3
fi
# NCCL: the system's (header and library where the compiler looks), else a
# Python wheel's (nvidia/nccl/{include,lib} in a site-packages directory)
NCCL_FLAGS="" NCCL_LIBS="-lnccl" NCCL_WHERE=""
CUDA_HOME_GUESS=$(dirname "$(dirname "$NVCC_BIN")")
for inc in /usr/include /usr/local/include "$CUDA_HOME_GUESS/include"; do
    if [ -f "$inc/nccl.h" ] && ldconfig -p 2>/dev/null | grep -q 'libnccl\.so'; then NCCL_WHERE="system ($inc/nccl.h)"; break; fi
done
if [ -z "$NCCL_WHERE" ]; then
    for d in $(python3 -c 'import site, sys; print(" ".join(site.getsitepackages() + sys.path))' 2>/dev/null); do
        n="$d/nvidia/nccl"
        if [ -f "$n/include/nccl.h" ] && [ -f "$n/lib/libnccl.so.2" ]; then
            NCCL_FLAGS="-I$n/include"
            if [ -f "$n/lib/libnccl.so" ]; then NCCL_LIBS="-L$n/lib -lnccl"; else NCCL_LIBS="-L$n/lib -l:libnccl.so.2"; fi
            NCCL_LIBS="$NCCL_LIBS -Xlinker -rpath -Xlinker $n/lib"
            export LD_LIBRARY_PATH="$n/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
            NCCL_WHERE="Python wheel ($n)"
            break
        fi
    done
fi
if [ -z "$NCCL_WHERE" ]; then
    say "gpu_check: no NCCL: neither nccl.h with libnccl.so on the system nor a Python wheel's nvidia/nccl"
    archive; rm -rf "$LOGS" "$WORK"; exit 3
fi
nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader | head -n 1 | sed 's/^/   gpu: /' | tee -a "$SUMMARY"
say "   nvcc: $("$NVCC_BIN" --version | tail -n 1)"
say "   nccl: $NCCL_WHERE"
HAVE_TORCH=0
python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null && HAVE_TORCH=1
say "   torch: $([ $HAVE_TORCH = 1 ] && python3 -c 'import torch; print(torch.__version__)' || echo 'none (its peer benchmark is skipped)')"
SM=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d ' .')
ARCH="-gencode arch=compute_${SM},code=sm_${SM}"
NVCC="$NVCC_BIN -O3 -std=c++17 -I. $ARCH -DLLM3D_NCCL $NCCL_FLAGS"
LIBS="-lcublas -lcublasLt $NCCL_LIBS"

# ---------------------------------------------------------------------------
phase "build ($ARCH)"
build() {  # build NAME CMD...: in the background, log in $LOGS/build_NAME.log
    local name=$1; shift
    ( timeout -k 5 240 "$@" > "$LOGS/build_$name.log" 2>&1; echo $? > "$WORK/build_$name.rc" ) &
}
build train_gpt2cu $NVCC train_gpt2.cu $LIBS -o train_gpt2cu
build test_gpt2cu $NVCC test_gpt2.cu $LIBS -o test_gpt2cu
if [ "$QUICK" = 0 ]; then  # only the phases QUICK=1 skips use these
    build train_gpt2cu_fp32 $NVCC -DENABLE_FP32 train_gpt2.cu $LIBS -o train_gpt2cu_fp32
    build test_gpt2cu_fp32 $NVCC -DENABLE_FP32 test_gpt2.cu $LIBS -o test_gpt2cu_fp32
fi
build kernels make -C dev/cuda -j6 NVCC="$NVCC_BIN" ARCH="$ARCH $NCCL_FLAGS" NVCC_LDLIBS="$LIBS"
build kernels_fp32 make -C dev/cuda -j6 NVCC="$NVCC_BIN" ARCH="$ARCH $NCCL_FLAGS" NVCC_LDLIBS="$LIBS" PRECISION=FP32
[ "$QUICK" = 0 ] && build cpu make -j4 train_gpt2 prepare_data dev/test/test_aead
# llm.c's GPU trainer, the speed peer of phase 11, from a copy of llm.c in
# LLMC_DIR (its train_gpt2.cu, llmc/ and Makefile, with cudnn-frontend/include
# beside them), built in $WORK with cuDNN flash attention (USE_CUDNN=1). cuDNN
# comes from the system or from the nvidia-cudnn wheel, NVML from the driver;
# without any of them the peer is skipped, with the reason, in phase 11
LLMC_WHY="" LLMC_LIB=""
find_cudnn() {  # prints "INCLUDE_DIR LIB_DIR" of a cuDNN 9, or nothing
    local d w
    for d in "$CUDA_HOME_GUESS" /usr /usr/local/cuda; do
        for w in lib64 lib lib/x86_64-linux-gnu; do
            if [ -f "$d/include/cudnn.h" ] && ls "$d/$w"/libcudnn.so* > /dev/null 2>&1; then echo "$d/include $d/$w"; return; fi
        done
    done
    for d in $(python3 -c 'import nvidia.cudnn as c; print(" ".join(c.__path__))' 2>/dev/null); do
        if [ -f "$d/include/cudnn.h" ] && [ -f "$d/lib/libcudnn.so.9" ]; then echo "$d/include $d/lib"; return; fi
    done
}
find_nvml() {  # prints the path of the driver's libnvidia-ml.so.1, or nothing
    local f
    f=$(ldconfig -p 2>/dev/null | grep -m1 'libnvidia-ml\.so\.1 ' | sed 's/.*=> //')
    [ -z "$f" ] && f=$(ls /usr/local/nvidia/lib64/libnvidia-ml.so.1 /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1 2>/dev/null | head -n 1)
    echo "$f"
}
if [ "$QUICK" = 1 ]; then LLMC_WHY="QUICK=1"
elif [ -z "${LLMC_DIR:-}" ]; then LLMC_WHY="LLMC_DIR is not set (a copy of llm.c's GPU trainer)"
elif [ ! -f "$LLMC_DIR/train_gpt2.cu" ] || [ ! -d "$LLMC_DIR/cudnn-frontend/include" ]; then
    LLMC_WHY="LLMC_DIR=$LLMC_DIR holds no train_gpt2.cu with cudnn-frontend/include"
else
    read -r CUDNN_INC LLMC_LIB <<< "$(find_cudnn)"
    NVML=$(find_nvml)
    if [ -z "$LLMC_LIB" ]; then LLMC_WHY="no cuDNN 9 (cudnn.h and libcudnn) on the system or in a wheel"
    elif [ -z "$NVML" ]; then LLMC_WHY="no libnvidia-ml.so.1 (NVML) found"
    else
        # -lcudnn and -lnvidia-ml want unversioned names: links of our own
        mkdir -p "$WORK/llmc_libs"
        ln -sf "$(ls "$LLMC_LIB"/libcudnn.so* | head -n 1)" "$WORK/llmc_libs/libcudnn.so"
        ln -sf "$NVML" "$WORK/llmc_libs/libnvidia-ml.so"
        cp -r "$LLMC_DIR" "$WORK/llmc"
        build llmc make -C "$WORK/llmc" train_gpt2cu USE_CUDNN=1 NO_MULTI_GPU=1 GPU_COMPUTE_CAPABILITY="$SM" \
            NVCC="$NVCC_BIN" NVCC_INCLUDES="-Icudnn-frontend/include -I$CUDNN_INC" \
            NVCC_LDFLAGS="-L$WORK/llmc_libs -L$LLMC_LIB -Xlinker -rpath=$LLMC_LIB -lcublas -lcublasLt -lcudnn -lnvrtc -lnvidia-ml"
    fi
fi
# ptxas's register report of every kernel in both builds: none may spill
build ptxas_bf16 $NVCC -Xptxas -v -c train_gpt2.cu -o "$WORK/ptxas_bf16.o"
build ptxas_fp32 $NVCC -DENABLE_FP32 -Xptxas -v -c train_gpt2.cu -o "$WORK/ptxas_fp32.o"
wait
for f in "$WORK"/build_*.rc; do
    name=$(basename "$f" .rc)
    if [ "$(cat "$f")" = "0" ]; then pass "$name"; else fail "$name: $(grep -m1 -E 'error' "$LOGS/$name.log" | cut -c1-160)"; fi
done
[ -z "$LLMC_WHY" ] && [ ! -x "$WORK/llmc/train_gpt2cu" ] && LLMC_WHY="its build failed (build_llmc.log)"
for prec in bf16 fp32; do
    spills=$(grep -E '[1-9][0-9]* bytes spill (stores|loads)' "$LOGS/build_ptxas_$prec.log" 2>/dev/null | wc -l)
    if [ ! -s "$LOGS/build_ptxas_$prec.log" ]; then skip "register spills ($prec): no ptxas report"
    elif [ "$spills" -eq 0 ]; then pass "no kernel spills registers ($prec build, ptxas -v)"
    else fail "register spills ($prec build): $spills ptxas lines with spill bytes (see build_ptxas_$prec.log)"; fi
done

# shards: tokens < 256 for every small model here (the tiny fixture's V = 500, -ev 256, -ev 512);
# a learnable stream (each token determines the next)
python3 - "$WORK/small_train_000000.bin" <<'EOF'
import array, struct, sys
n = 40000
tokens = array.array("H", ((i * 7919 + 13) % 251 for i in range(n)))
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
    f.write(tokens.tobytes())
EOF
SMALL="-i $WORK/small_train_*.bin -j $WORK/small_train_*.bin"

# ---------------------------------------------------------------------------
# what the layout, fault and checkpoint phases share.
# compare BOUND WHAT REF LOG [resumed]: LOG's losses (and with BOUND < 1e-3
# grad norms) within BOUND of REF's, step by step. LOG has REF's steps; with
# "resumed", the steps it has (a run resumed from a checkpoint logs its own).
# A log that is not there is a skip: its run has said why (failed, or no time)
compare() {
    local out
    out=$(python3 - "$@" <<'EOF'
import json, sys
bound, what, ref_path, got_path = float(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
resumed = len(sys.argv) > 5
# the steps' lines; the final model's line after the last step (a val loss
# alone, with -v) has no train loss to compare
load = lambda p: {r["step"]: r for r in map(json.loads, open(p)) if "loss" in r}
try:
    ref, got = load(ref_path), load(got_path)
except FileNotFoundError as e:
    print(f"SKIP {what}: no {e.filename.split('/')[-1]}"); sys.exit(0)
except (OSError, ValueError, KeyError) as e:
    print(f"FAIL {what}: {type(e).__name__} {e}"); sys.exit(0)
keys = ["loss", "norm"] if bound < 1e-3 else ["loss"]
if not got or not set(got) <= set(ref) or (not resumed and set(got) != set(ref)):
    print(f"FAIL {what}: steps {sorted(got)[:3]}... ({len(got)}) against {len(ref)} of the reference"); sys.exit(0)
worst = max(abs(got[s][k] - ref[s][k]) for s in got for k in keys)
print(f"{'ok' if worst <= bound else 'FAIL'} {what}: steps {min(got)}-{max(got)}, worst {'/'.join(keys)} difference {worst:.2e} (bound {bound:g})")
EOF
)
    case $out in ok*) pass "${out#ok }" ;; SKIP*) skip "${out#SKIP }" ;; *) fail "${out#FAIL }" ;; esac
}
# A case of several ranks on this one GPU runs in one of two modes: "host"
# (host mode, the default where ranks share a GPU: the host backend) or
# "nccl" (-hb 2: real NCCL, each rank an NCCL node of its own). mode_flag:
# the trainer's flag for a mode; mode_tag: the prefix of its cases' names;
# wt: the weight of a case of N ranks in background (NCCL's count)
mode_flag() { if [ "$1" = nccl ]; then echo "-hb 2"; fi; }
mode_tag() { if [ "$1" = nccl ]; then echo "nccl_"; fi; }
wt() { if [ "$1" = nccl ]; then echo "$2"; else echo 1; fi; }
np_of() { local n; n=$(echo " $* " | sed -n 's/.* -np \([0-9][0-9]*\) .*/\1/p'); echo "${n:-1}"; }
# nccl_fits MODE NP NAME: 0 when a case of NP ranks may run in MODE: in nccl
# mode no more ranks than the probe (phase 2) ran, else NAME is skipped
NCCL_RANKS=0
nccl_fits() {
    if [ "$1" != nccl ] || [ "$2" -le "$NCCL_RANKS" ]; then return 0; fi
    skip "$3: needs $2 NCCL ranks on this GPU; the probe ran ${NCCL_RANKS}"
    return 1
}
# unsealed DIR...: "N M", of the M files model.bin, optim.bin and state.bin
# of the checkpoint directories DIR..., the N that are missing or not sealed
# (a sealed file opens with "llm3dgcm": doc/formats.md)
unsealed() {
    local plain=0 nfiles=0 d f
    for d in "$@"; do
        for f in model.bin optim.bin state.bin; do
            nfiles=$((nfiles + 1))
            [ "$(head -c 8 "$d/$f" 2>/dev/null)" = llm3dgcm ] || plain=$((plain + 1))
        done
    done
    echo "$plain $nfiles"
}

# nccl_ran MODE NAME: in nccl mode, that NAME's log shows the job over NCCL
# (rank 0's -hb 2 line, and no host mode), else a failure; a dry run's CPU
# trainer prints neither
nccl_ran() {
    if [ "$1" != nccl ] || [ "$DRYRUN" = 1 ]; then return 0; fi
    if grep -q '^NCCL with -hb 2: ' "$LOGS/$2.log" && ! grep -q '^host mode: ' "$LOGS/$2.log"; then return 0; fi
    fail "$2: it ran, but not over NCCL (no -hb 2 line from rank 0; see $2.log)"
    return 1
}
# layout_ran NAME LAYOUT_ARGS: that rank 0's layout line in NAME's log names
# the schedule LAYOUT_ARGS asked for with -ps ("zbv schedule with" on the
# GPU, "schedule zbv," on the CPU) and, with -sp 1, sequence parallelism;
# else a failure: a flag dropped on the way runs 1f1b or plain tp, with
# the same losses
layout_ran() {
    local log=$LOGS/$1.log ps sp line
    ps=$(echo " $2 " | sed -n 's/.* -ps \([a-z0-9]*\) .*/\1/p')
    sp=$(echo " $2 " | sed -n 's/.* -sp \([0-9]*\) .*/\1/p')
    line=$(grep -m1 '^layout: ' "$log")
    if [ -z "$line" ]; then fail "$1: no layout line from rank 0 (see $1.log)"; return 1; fi
    if [ -n "$ps" ] && ! echo "$line" | grep -qE "(schedule ${ps}[ ,]| ${ps} schedule )"; then
        fail "$1: -ps $ps asked, but the layout line names another schedule: $(echo "$line" | cut -c1-140)"
        return 1
    fi
    if [ "${sp:-0}" != 0 ] && ! echo "$line" | grep -qF ' (sequence parallel)'; then
        fail "$1: -sp $sp asked, but the layout line has no '(sequence parallel)': $(echo "$line" | cut -c1-140)"
        return 1
    fi
}
# want NCCL_LINE DRY_LINE: what a check over NCCL looks for; in a dry run
# the CPU trainer's host backend prints DRY_LINE instead
want() { if [ "$DRYRUN" = 1 ]; then echo "$2"; else echo "$1"; fi; }

# layouts: test_layouts' cases. Each runs 10 steps with the same global
# batch as its one-rank run, which runs once (a later phase reuses it).
ref_of() { echo "$LOGS/${1}_one_$(echo "$2" | tr -c 'a-z0-9' '_').jsonl"; }
one_rank() {  # one_rank PREC BASE_ARGS
    local bin=./train_gpt2cu ref
    [ "$1" = fp32 ] && bin=./train_gpt2cu_fp32
    ref=$(ref_of "$1" "$2")
    [ -s "$ref" ] && return 0
    # a run cut short leaves part of its log: none, so that its layouts say there is nothing to compare with
    run "$(basename "$ref" .jsonl)" 60 $bin -x 10 -v 0 -s 0 $SMALL $2 -lg "$ref" || { rm -f "$ref"; return 1; }
}
layout() {  # layout PREC BOUND NAME BASE_ARGS LAYOUT_ARGS [MODE]
    local prec=$1 bound=$2 base=$4 lay=$5 mode=${6:-host} bin=./train_gpt2cu ref name
    name="${prec}_$(mode_tag "$mode")$3"
    [ "$prec" = fp32 ] && bin=./train_gpt2cu_fp32
    ref=$(ref_of "$prec" "$base")
    if [ ! -s "$ref" ]; then skip "$name: no one-rank run to compare with"; return; fi
    nccl_fits "$mode" "$(np_of $lay)" "$name" || return
    local limit=90
    [ "$mode" = nccl ] && limit=120  # milliseconds a call, the ranks time-sharing the GPU
    run "$name" $limit $bin -x 10 -v 0 -s 0 $SMALL $base $lay $(mode_flag "$mode") -lg "$LOGS/$name.jsonl" &&
        nccl_ran "$mode" "$name" && layout_ran "$name" "$lay" &&
        compare "$bound" "$prec $(mode_tag "$mode")$3" "$ref" "$LOGS/$name.jsonl"
}
TINY="-e dev/fixtures/tiny_model.bin"      # L=2 NH=4 C=64 V=500
DEEP="-e d4 -ec 64 -ev 256 -et 16"          # L=4 NH=4 C=64 V=256
DEEP8="-e d8 -ec 128 -ev 256 -et 16"        # L=8 NH=8 C=128 V=256: pp 4 x 2 chunks
DP2="$TINY -b 2 -t 16 -d 64" DP4="$TINY -b 2 -t 16 -d 128" TP="$TINY -b 2 -t 16 -d 32"
PP2="$TINY -b 1 -t 16 -d 64" PP4="$DEEP -b 1 -t 16 -d 64" PP8="$DEEP8 -b 1 -t 16 -d 64" GRID="$TINY -b 2 -t 16 -d 128"
PPDP="$DEEP -b 1 -t 16 -d 128"              # 8 micro-batches: dp 2 x -mb 4 at pp 2, on 2 x 2 chunks
layouts() {  # layouts PREC BOUND [MODE]: the one-rank runs first, then every layout against its own
    local p=$1 b=$2 m=${3:-host} base z s
    for base in "$DP2" "$DP4" "$TP" "$PP2" "$PP4" "$PP8" "$PPDP"; do background one_rank $p "$base"; done  # GRID = DP4
    collect
    for z in 0 1 2 3; do W=$(wt $m 2) background layout $p $b dp2_z$z "$DP2" "-np 2 -z $z" $m; done
    for z in 0 1 2 3; do W=$(wt $m 4) background layout $p $b dp4_z$z "$DP4" "-np 4 -z $z" $m; done
    W=$(wt $m 2) background layout $p $b tp2 "$TP" "-np 2 -tp 2" $m
    W=$(wt $m 4) background layout $p $b tp4 "$TP" "-np 4 -tp 4" $m
    for s in gpipe 1f1b; do
        W=$(wt $m 2) background layout $p $b pp2_$s "$PP2" "-np 2 -pp 2 -ps $s -mb 4" $m
        W=$(wt $m 4) background layout $p $b pp4_$s "$PP4" "-np 4 -pp 4 -ps $s -mb 4" $m
    done
    # the schedules with chunks of layers or a split backward (built, first run here): interleaved
    # (-pv 2) and zbv need pp x 2 layers, so pp 2 on d4 and pp 4 on d8; zbh1 on d4
    for s in "interleaved -pv 2" zbh1 zbv; do
        W=$(wt $m 2) background layout $p $b "pp2_${s%% *}" "$PP4" "-np 2 -pp 2 -ps $s -mb 4" $m
    done
    W=$(wt $m 4) background layout $p $b pp4_zbh1 "$PP4" "-np 4 -pp 4 -ps zbh1 -mb 4" $m
    for s in "interleaved -pv 2" zbv; do
        W=$(wt $m 4) background layout $p $b "pp4_${s%% *}" "$PP8" "-np 4 -pp 4 -ps $s -mb 4" $m
    done
    # the same schedules through what only the GPU trainer has: the side stream's dp sums (ZeRO-1)
    # and ZeRO-2/3's buckets against the deferred W ops, ZeRO-3's slots with wte kept by zbv's
    # chunk 0 (stage 0 holds the embeddings and the head), tp's sums in B alone, -sp's gathers in
    # W, and over NCCL the MAC checks of pooled activation sets beside dp and tp
    for z in 1 3; do W=$(wt $m 4) background layout $p $b pp2dp2_zbv_z$z "$PPDP" "-np 4 -pp 2 -ps zbv -mb 4 -z $z" $m; done
    W=$(wt $m 4) background layout $p $b pp2dp2_interleaved_z2 "$PPDP" "-np 4 -pp 2 -ps interleaved -pv 2 -mb 4 -z 2" $m
    W=$(wt $m 4) background layout $p $b pp2tp2_zbh1 "$PP4" "-np 4 -tp 2 -pp 2 -ps zbh1 -mb 4" $m
    W=$(wt $m 8) background layout $p $b grid222_zbv_z1_sp "$PPDP" "-np 8 -tp 2 -pp 2 -z 1 -sp 1 -ps zbv -mb 4" $m
    for z in 1 3; do W=$(wt $m 8) background layout $p $b grid222_z$z "$GRID" "-np 8 -tp 2 -pp 2 -z $z" $m; done
    # sequence parallelism (-sp 1): the rows of each micro-batch split among the tp ranks
    W=$(wt $m 2) background layout $p $b tp2_sp "$TP" "-np 2 -tp 2 -sp 1" $m
    W=$(wt $m 4) background layout $p $b tp4_sp "$TP" "-np 4 -tp 4 -sp 1" $m
    # -sp beside ZeRO-3's gradient shards (sp_layernorm_run's sums over grad_shard) with dp 2, and
    # beside interleaved's chunks and tp (the sets' -sp rows, the lent logits at tp 2)
    W=$(wt $m 4) background layout $p $b dp2tp2_z3_sp "$DP2" "-np 4 -tp 2 -z 3 -sp 1" $m
    W=$(wt $m 4) background layout $p $b pp2tp2_interleaved_sp "$PP4" "-np 4 -tp 2 -pp 2 -ps interleaved -pv 2 -sp 1 -mb 4" $m
    W=$(wt $m 8) background layout $p $b grid222_z1_sp "$GRID" "-np 8 -tp 2 -pp 2 -z 1 -sp 1" $m
    # checked collectives (-ic 1): the same losses as without, no false alarm
    W=$(wt $m 2) background ic_layout $p $b ic_dp2_z1 "$DP2" "-np 2 -z 1 -ic 1" $m
    W=$(wt $m 2) background ic_layout $p $b ic_tp2 "$TP" "-np 2 -tp 2 -ic 1" $m
    W=$(wt $m 4) background ic_layout $p $b ic_pp2dp2_zbv_z3 "$PPDP" "-np 4 -pp 2 -ps zbv -mb 4 -z 3 -ic 1" $m
    collect
    bubbles_measured $p $m
}
# the GPU trainer's bubble meter (pipeline_run.cuh's clock on the GPU, first
# run here): every pipeline layout above that trained to its last step
# printed the run's measured bubble, strictly between 0 and 1 (a stage of
# two or more always waits), and the ops' mean costs it timed (watch.h's
# pipe_meter_print, the CPU trainer's line too): F and B above the 1 us that
# a clock which timed nothing floors them at (F also holds the data's
# staging, so B is the check that the op marks are read), W above it where
# the schedule splits the backward (zbh1, zbv) and 0 where it does not. Its
# ranks share this one GPU, so the figure is not held to the simulator's
# (phase 13 holds the CPU trainer's to it)
bubble_line_ok() {  # bubble_line_ok LOG: 0 when LOG's bubble line passes, else prints what it holds
    sed -nE 's/^pipeline bubble \(([a-z0-9]+), .*: measured ([0-9.]+) mean.*, for F ([0-9]+) us, B ([0-9]+) us, W ([0-9]+) us.*/\1 \2 \3 \4 \5/p' "$1" |
        awk '{ n++; sched = $1; m = $2; f = $3; b = $4; w = $5 }
        END {
            if (n != 1) { print "no bubble line with its op costs"; exit 1 }
            splits = sched == "zbh1" || sched == "zbv"
            if (m + 0 > 0 && m + 0 < 1 && f + 0 > 1 && b + 0 > 1 && (splits ? w + 0 > 1 : w + 0 == 0)) exit 0
            printf "%s: measured %s, F %s us, B %s us, W %s us (W %s)\n", sched, m, f, b, w, splits ? "> 1" : "0"
            exit 1
        }'
}
bubbles_measured() {  # bubbles_measured PREC [MODE]
    local prefix="$1_$(mode_tag "${2:-host}")" what="bubble meter ($1, ${2:-host} mode)" log why n=0 bad=""
    for log in "$LOGS/${prefix}"pp*.log "$LOGS/${prefix}"grid222*.log; do
        [ -f "$log" ] && grep -qE '^step +9/10 ' "$log" || continue
        n=$((n + 1))
        why=$(bubble_line_ok "$log") || bad="$bad $(basename "$log" .log) ($why)"
    done
    if [ $n = 0 ]; then skip "$what: no pipeline layout ran to its last step"
    elif [ -z "$bad" ]; then pass "$what: $n pipeline layouts printed a measured bubble in (0, 1), F and B timed, W as split"
    else fail "$what: no measured bubble in (0, 1) with F, B > 1 us and W as the schedule splits from$bad"; fi
}
# checks_ran MODE NAME: NAME's log shows that its -ic 1 checks ran to the
# end of the job: over NCCL, rank 0's count of calls judged (more than 0; a
# hook that never queued a record would pass every check point with none);
# in host mode, and in a dry run (the CPU trainer), the host backend's line
checks_ran() {
    local log=$LOGS/$2.log calls points
    if [ "$1" = nccl ] && [ "$DRYRUN" != 1 ]; then
        read -r calls points <<< "$(sed -nE 's/^checked collectives over NCCL: ([0-9]+) calls judged in ([0-9]+) check points.*/\1 \2/p' \
            "$log" | tail -n 1)"
        if [ "${calls:-0}" -gt 0 ] && [ "${points:-0}" -gt 0 ]; then
            pass "$2: -ic 1 judged $calls calls in $points check points over NCCL (rank 0's)"
        else
            fail "$2: -ic 1 judged ${calls:-no} calls over NCCL (rank 0's lines: $(grep -c '^checked collectives over NCCL: ' "$log"); see $2.log)"
        fi
    elif grep -q '^checked collectives: ' "$log"; then
        pass "$2: -ic 1 checked the host backend's collectives ($(sed -nE 's/^checked collectives: ([0-9.]+) ms per step.*/\1/p' \
            "$log" | head -n 1) ms a step of rank 0's in the checks' own passes)"
    else
        fail "$2: no 'checked collectives:' line from rank 0: were the checks on? (see $2.log)"
    fi
}
# ic_layout: a layout (layout's arguments) with -ic 1, and its checks ran,
# where it trained to its last step (else layout has said why)
ic_layout() {
    layout "$@"
    local name="$1_$(mode_tag "${6:-host}")$3"
    [ -f "$LOGS/$name.log" ] && grep -qE '^step +9/10 ' "$LOGS/$name.log" && checks_ran "${6:-host}" "$name"
    return 0
}
layouts_bf16() {  # layouts_bf16 [MODE]: a subset of them in bf16, within 2e-2 (the "bf16 bound" above)
    local m=${1:-host} base
    for base in "$DP2" "$TP" "$PP2" "$PP4" "$GRID"; do background one_rank bf16 "$base"; done
    collect
    W=$(wt $m 2) background layout bf16 2e-2 dp2_z3 "$DP2" "-np 2 -z 3" $m
    W=$(wt $m 2) background layout bf16 2e-2 pp2_zbv "$PP4" "-np 2 -pp 2 -ps zbv -mb 4" $m  # chunks and the split backward
    W=$(wt $m 2) background layout bf16 2e-2 tp2 "$TP" "-np 2 -tp 2" $m
    W=$(wt $m 2) background layout bf16 2e-2 pp2_1f1b "$PP2" "-np 2 -pp 2 -ps 1f1b -mb 4" $m
    W=$(wt $m 8) background layout bf16 2e-2 grid222_z1 "$GRID" "-np 8 -tp 2 -pp 2 -z 1" $m
    W=$(wt $m 2) background layout bf16 2e-2 tp2_sp "$TP" "-np 2 -tp 2 -sp 1" $m
    # checked collectives in bf16: the bound of sums rounded at every hop, no false alarm
    W=$(wt $m 2) background ic_layout bf16 2e-2 ic_dp2_z1 "$DP2" "-np 2 -z 1 -ic 1" $m
    W=$(wt $m 2) background ic_layout bf16 2e-2 ic_tp2 "$TP" "-np 2 -tp 2 -ic 1" $m
    collect
}

# faults: the job ends (not exit 0) after steps 0-2, naming the culprit
# (kill: 2 or 3 steps, as in test_layouts: the launcher may stop rank 0
# before it logs step 2)
fault() {  # fault NAME ARGS EXPECT LEAST [MODE]
    local mode=${5:-host} name args expect=$3 least=$4 limit
    name="$(mode_tag "$mode")$1" args="$2 $(mode_flag "$mode")"
    if ! limit=$(time_left 30); then skip "fault $name: past the deadline"; return; fi
    local t0=$SECONDS
    timeout -k 5 "$limit" ./train_gpt2cu -x 10 -v 0 -s 0 $SMALL $TINY -b 2 -t 16 -d 64 -np 2 -to 3 $args \
        -lg "$LOGS/fault_$name.jsonl" > "$LOGS/fault_$name.log" 2>&1
    local rc=$? steps
    cut_short "fault $name" 30 "$limit" $rc $((SECONDS - t0)) && return
    steps=$(wc -l < "$LOGS/fault_$name.jsonl" 2>/dev/null || echo 0)
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$steps" -ge "$least" ] && [ "$steps" -le 3 ] &&
       grep -q "$expect" "$LOGS/fault_$name.log"; then
        pass "fault $name: exit $rc after $steps steps: $(grep -m1 "$expect" "$LOGS/fault_$name.log" | cut -c1-140)"
    else
        fail "fault $name: exit $rc, $steps steps logged, '$expect' $(grep -q "$expect" "$LOGS/fault_$name.log" && echo named || echo 'not named')"
    fi
}
# the watch report (-wr 3): rank 1 of 4, slowed by 300 ms a step from step
# 3, is named a straggler at the report after step 8 (two slow reports in a
# row, as in test_layouts), on stdout and in step 8's log line, and no other
# rank is; the job ends normally. Over NCCL the waits are NCCL's wait clocks.
watch_slow() {  # watch_slow [MODE]
    local mode=${1:-host} limit log name
    name="$(mode_tag "$mode")watch_slow" log=$LOGS/$name
    nccl_fits "$mode" 4 "$name" || return
    if ! limit=$(time_left 30); then skip "$name: past the deadline"; return; fi
    local t0=$SECONDS
    timeout -k 5 "$limit" ./train_gpt2cu -x 9 -v 0 -s 0 $SMALL $DP4 -np 4 -wr 3 -fault slow:1:3 $(mode_flag "$mode") \
        -lg "$log.jsonl" > "$log.log" 2>&1
    local rc=$? named others logged
    cut_short "$name" 30 "$limit" $rc $((SECONDS - t0)) && return
    named=$(grep -c "step 8: rank 1 is a straggler: compute .* for 2 reports" "$log.log")
    others=$(grep -cE "rank [023] is a straggler" "$log.log")
    logged=$(grep -c '^{"step": 8,.*"stragglers": \[1\], "compute_ms": \[' "$log.jsonl" 2>/dev/null)
    if [ $rc -eq 0 ] && [ "$named" -ge 1 ] && [ "$others" -eq 0 ] && [ "${logged:-0}" -eq 1 ]; then
        pass "$name, -wr 3 -fault slow:1:3 on 4 ranks: $(grep -m1 'rank 1 is a straggler' "$log.log" | cut -c1-140)"
    else
        fail "$name: exit $rc, rank 1 named $named times, other ranks $others, step 8's log fields ${logged:-0} (see $name.log)"
    fi
}
# -ck 1: rank 2 of 4 replicas, one parameter changed at step 3, is named by
# the consistency check before step 3 trains; exit 1 after steps 0-2
check_drift() {  # check_drift [MODE]
    local mode=${1:-host} limit log name
    local want="step 3: data-parallel replicas disagree: the parameters of rank 2 differ from those of ranks 0, 1, 3 (the majority of the 4 replicas), first in wte"
    name="$(mode_tag "$mode")check_drift" log=$LOGS/$name
    nccl_fits "$mode" 4 "$name" || return
    if ! limit=$(time_left 30); then skip "$name: past the deadline"; return; fi
    local t0=$SECONDS
    timeout -k 5 "$limit" ./train_gpt2cu -x 10 -v 0 -s 0 $SMALL $DP4 -np 4 -ck 1 -fault drift:2:3 $(mode_flag "$mode") \
        -lg "$log.jsonl" > "$log.log" 2>&1
    local rc=$? steps
    cut_short "$name" 30 "$limit" $rc $((SECONDS - t0)) && return
    steps=$(wc -l < "$log.jsonl" 2>/dev/null || echo 0)
    if [ $rc -eq 1 ] && [ "$steps" -eq 3 ] && grep -qF "$want" "$log.log"; then
        pass "$name, -ck 1 -fault drift:2:3 on 4 replicas: exit 1 after 3 steps, rank 2 named"
    else
        fail "$name: exit $rc, $steps steps logged, rank 2 $(grep -qF "$want" "$log.log" && echo named || echo 'not named') (see $name.log)"
    fi
}
# -ic 1 -fault corrupt:1:3: the bit rank 1 flips in its input to a
# collective of step 3 (after its sketch) is caught at that step's check,
# named (the step, the collective, its group), exit 1 after steps 0-2, and no
# checkpoint from step 3 (-n 1 writes one after every step: the one after
# step 2 is there, none after step 3). LAYOUT: dp 2 ZeRO-1 (the gradients'
# reduce-scatter: the sums' bound), tp 2 (the tp all-reduces) or dp 2 ZeRO-3
# (step 3's first collective is unit 0's parameter all-gather, unit_acquire:
# the bit-exact check of a gathered piece).
check_corrupt() {  # check_corrupt NAME LAYOUT [MODE]
    local mode=${3:-host} limit log name dir
    name="$(mode_tag "$mode")ic_corrupt_$1" log=$LOGS/$name dir=$CK/$name
    nccl_fits "$mode" 2 "$name" || return
    if ! limit=$(time_left 30); then skip "$name: past the deadline"; return; fi
    rm -rf "$dir"
    local t0=$SECONDS
    timeout -k 5 "$limit" ./train_gpt2cu -x 10 -v 0 -s 0 $SMALL $2 -ic 1 -n 1 -nk 0 -o "$dir" -fault corrupt:1:3 \
        $(mode_flag "$mode") -lg "$log.jsonl" > "$log.log" 2>&1
    local rc=$? steps named flipped
    cut_short "$name" 30 "$limit" $rc $((SECONDS - t0)) && return
    nccl_ran "$mode" "$name" || return
    steps=$(wc -l < "$log.jsonl" 2>/dev/null || echo 0)
    named=$(grep -m1 "step 3: checked .* failed: " "$log.log")
    flipped=$(grep -c "fault corrupt: flipped bit" "$log.log")
    if [ $rc -eq 1 ] && [ "$steps" -eq 3 ] && [ -n "$named" ] && [ "$flipped" -ge 1 ] &&
       [ -e "$dir/ckpt_00000003" ] && [ ! -e "$dir/ckpt_00000004" ]; then
        pass "$name: exit 1 after 3 steps, no checkpoint from step 3: $(echo "$named" | cut -c1-150)"
    else
        fail "$name: exit $rc, $steps steps logged, $([ -n "$named" ] && echo named || echo 'not named'), $flipped flips, checkpoints $(ls "$dir" 2>/dev/null | tr '\n' ' ') (see $name.log)"
    fi
}
# -fault poison:1:3 (-gp warn, the default): rank 1's gradients x100 from
# step 3 on are named by the gradient-norm rule at steps 3 and 4, nobody
# else; the updates are applied, exit 0
check_poison() {  # check_poison [MODE]
    local mode=${1:-host} limit log name
    name="$(mode_tag "$mode")gp_poison" log=$LOGS/$name
    nccl_fits "$mode" 2 "$name" || return
    if ! limit=$(time_left 30); then skip "$name: past the deadline"; return; fi
    local t0=$SECONDS
    timeout -k 5 "$limit" ./train_gpt2cu -x 5 -v 0 -s 0 $SMALL $DP2 -np 2 -fault poison:1:3 $(mode_flag "$mode") \
        -lg "$log.jsonl" > "$log.log" 2>&1
    local rc=$? named others
    cut_short "$name" 30 "$limit" $rc $((SECONDS - t0)) && return
    nccl_ran "$mode" "$name" || return
    named=$(grep -cE "step [34]: rank 1's own gradient norm" "$log.log")
    others=$(grep -cE "rank 0's own gradient norm|step [012]: rank 1's own" "$log.log")
    if [ $rc -eq 0 ] && [ "$named" -eq 2 ] && [ "$others" -eq 0 ]; then
        pass "$name, -fault poison:1:3 on dp 2: $(grep -m1 "rank 1's own gradient norm" "$log.log" | cut -c1-150)"
    else
        fail "$name: exit $rc, rank 1 named at $named of steps 3-4, $others other lines (see $name.log)"
    fi
}
faults() {  # faults [MODE]: tamper, replay, kill, stall, the watch report and the consistency check
    local m=${1:-host}
    if [ "$m" = nccl ]; then
        # over NCCL a MAC'd pipeline message is checked at the step's end,
        # before the update: the receiver's "does not verify" line; a stalled
        # rank is named by the watchdog of the rank waiting for it (the board)
        local mac
        mac=$(want "activation message of micro-batch 0 from rank 0 (.* bytes, step 3) does not verify" \
                   "from rank 0, channel activation, step 3")
        W=2 background fault tamper "-pp 2 -fault tamper:0:3" "$mac" 3 nccl
        W=2 background fault replay "-pp 2 -fault replay:0:3" "$mac" 3 nccl
        W=2 background fault kill "-fault kill:1:3" "rank 1 killed by signal 9" 2 nccl
        W=2 background fault stall "-fault stall:1:3" "$(want "rank 1 is not waiting for its GPU" "waiting for rank 1")" 3 nccl
    else
        background fault tamper "-pp 2 -fault tamper:0:3" "from rank 0, channel activation, step 3" 3
        background fault replay "-pp 2 -fault replay:0:3" "from rank 0, channel activation, step 3" 3
        background fault kill "-fault kill:1:3" "rank 1" 2
        background fault stall "-fault stall:1:3" "rank 1" 3
    fi
    W=$(wt $m 4) background watch_slow $m
    W=$(wt $m 4) background check_drift $m
    # checked collectives (-ic 1) and the gradient-norm rule (-gp)
    W=$(wt $m 2) background check_corrupt dp2_z1 "$DP2 -np 2 -z 1" $m
    W=$(wt $m 2) background check_corrupt tp2 "$TP -np 2 -tp 2" $m
    W=$(wt $m 2) background check_corrupt dp2_z3 "$DP2 -np 2 -z 3" $m
    W=$(wt $m 2) background check_poison $m
    collect
}

# checkpoints and signals
CK="$WORK/ckpt"
mkdir -p "$CK"
# sigterm_check NAME ARGS: SIGTERM once the run is under way (after step
# 5): every rank finishes the step, the checkpoint is written, exit 0, and
# no rank failed on the way. Not under timeout, which would pass the signal
# on twice (to the trainer and to its process group), and a second signal
# kills.
sigterm_check() {
    local name=$1 args=$2 limit pid rc
    if ! limit=$(time_left 60); then skip "SIGTERM ($name): past the deadline"; return; fi
    ./train_gpt2cu $args -x 100000 -o "$CK/$name" > "$LOGS/$name.log" 2>&1 &
    pid=$!
    for _ in $(seq $((limit * 5))); do
        grep -q "^step  *5/" "$LOGS/$name.log" && break
        kill -0 $pid 2>/dev/null || break
        sleep 0.2
    done
    kill -TERM $pid 2>/dev/null
    for _ in $(seq $((limit * 5))); do kill -0 $pid 2>/dev/null || break; sleep 0.2; done
    kill -KILL $pid 2>/dev/null; wait $pid; rc=$?
    if [ $rc -eq 0 ] && grep -q "stopped by a signal after step" "$LOGS/$name.log" &&
       ! grep -qE "^rank [0-9]+ (exited with status|killed by signal)" "$LOGS/$name.log" &&
       ls -d "$CK/$name"/ckpt_* > /dev/null 2>&1; then
        pass "SIGTERM ($name): $(grep -m1 'stopped by a signal' "$LOGS/$name.log")"
    else
        fail "SIGTERM ($name): exit $rc (see $name.log)"
    fi
}
# nccl_ckpt Z: fp32, (2, 2, 2) with ZeRO-Z over NCCL, 8 steps with a
# checkpoint after steps 3 and 7 (ckpt_00000004, ckpt_00000008), every rank
# writing its part; the step-4 checkpoint then resumed by the same layout
# (bit for bit: the losses and norms, step 8's model.bin and optim.bin), by
# one rank (within 1e-5: another layout sums in another order) and by the
# CPU trainer (its step 4 within 2e-5, as in phase 8). ZeRO-3's are sealed
# (-enc 1): every rank's GHASH shares go to rank 0 over NCCL (ckpt_gather),
# and each resume checks the tags of what it reads (each of 8 ranks only the
# chunks of its units: ckpt_model_load_part, ckpt_optim_open); a sealed
# file's bytes differ from run to run (its id, the shares' salts), so there
# its files are checked to be sealed instead of byte-identical
nccl_ckpt() {
    local z=$1 d="$WORK/ckpt_nccl_z$1" name="nccl_ck_z$1" x enc="" plain nfiles
    [ "$z" = 3 ] && enc="-enc 1"
    local args="$GRID -v 0 -s 0 $SMALL -x 8 -n 4 $enc" lay="-np 8 -tp 2 -pp 2 -z $1 -hb 2"
    mkdir -p "$d"
    run $name 120 ./train_gpt2cu_fp32 $args $lay -o "$d/full" -lg "$LOGS/$name.jsonl" && nccl_ran nccl $name || return
    for x in same one cpu; do mkdir -p "$d/$x" && cp -r "$d/full/ckpt_00000004" "$d/full/job.key" "$d/$x/"; done
    if run ${name}_resumed 120 ./train_gpt2cu_fp32 $args $lay -o "$d/same" -y 1 -lg "$LOGS/${name}_resumed.jsonl"; then
        compare 0 "8 NCCL ranks, ZeRO-$z: resumed by the same layout from step 4, the same losses and norms" \
            "$LOGS/$name.jsonl" "$LOGS/${name}_resumed.jsonl" resumed
        if [ -n "$enc" ]; then
            read -r plain nfiles < <(unsealed "$d/full/ckpt_00000004" "$d/full/ckpt_00000008" "$d/same/ckpt_00000008")
            if [ $plain -eq 0 ]; then pass "8 NCCL ranks, ZeRO-$z, -enc 1: the $nfiles files of the 3 checkpoints are sealed (llm3dgcm)"
            else fail "8 NCCL ranks, ZeRO-$z, -enc 1: $plain of the $nfiles files of the 3 checkpoints are missing or not sealed"; fi
        elif cmp -s "$d/full/ckpt_00000008/model.bin" "$d/same/ckpt_00000008/model.bin" &&
           cmp -s "$d/full/ckpt_00000008/optim.bin" "$d/same/ckpt_00000008/optim.bin"; then
            pass "8 NCCL ranks, ZeRO-$z: step 8's model.bin and optim.bin byte-identical, uninterrupted and resumed"
        else
            fail "8 NCCL ranks, ZeRO-$z: step 8's checkpoint differs between the uninterrupted and the resumed run"
        fi
    fi
    run ${name}_on_one 60 ./train_gpt2cu_fp32 $args -o "$d/one" -y 1 -lg "$LOGS/${name}_on_one.jsonl" &&
        compare 1e-5 "8 NCCL ranks, ZeRO-$z: the step-4 checkpoint resumed by one rank" \
            "$LOGS/$name.jsonl" "$LOGS/${name}_on_one.jsonl" resumed
    if [ -x ./train_gpt2 ]; then
        run ${name}_on_cpu 120 ./train_gpt2 $GRID -v 0 -s 0 $SMALL -x 5 -o "$d/cpu" -y 1 -lg "$LOGS/${name}_on_cpu.jsonl" &&
            compare 2e-5 "8 NCCL ranks, ZeRO-$z: the step-4 checkpoint resumed by the CPU trainer" \
                "$LOGS/$name.jsonl" "$LOGS/${name}_on_cpu.jsonl" resumed
    else
        skip "${name}_on_cpu: train_gpt2 not built"
    fi
}
# resume_across [MODE]: a checkpoint of one schedule resumed by another:
# fp32, pp 2 with 1f1b for 8 steps, a checkpoint after step 3; its step-4
# checkpoint resumed under zbv (each stage two chunks, the split backward),
# its steps within 1e-5 of the run it left (the sums go in another order)
resume_across() {
    local m=${1:-host} name d args
    name="$(mode_tag "$m")resume_1f1b_zbv" d="$WORK/$(mode_tag "$m")resume_1f1b_zbv"
    nccl_fits "$m" 2 "$name" || return
    args="$PP4 -v 0 -s 0 $SMALL -x 8 -n 4 -np 2 -pp 2 -mb 4 $(mode_flag "$m")"
    mkdir -p "$d/zbv"
    run "$name" 120 ./train_gpt2cu_fp32 $args -ps 1f1b -o "$d/full" -lg "$LOGS/$name.jsonl" && nccl_ran "$m" "$name" ||
        return
    cp -r "$d/full/ckpt_00000004" "$d/full/job.key" "$d/zbv/" &&
        run "${name}_resumed" 120 ./train_gpt2cu_fp32 $args -ps zbv -o "$d/zbv" -y 1 -lg "$LOGS/${name}_resumed.jsonl" &&
        nccl_ran "$m" "${name}_resumed" &&
        compare 1e-5 "$(mode_tag "$m")pp 2: 1f1b's step-4 checkpoint resumed under zbv" "$LOGS/$name.jsonl" \
            "$LOGS/${name}_resumed.jsonl" resumed
}
# outside NAME LAUNCHER...: dp 2 over NCCL (-hb 2), its 2 ranks started by
# LAUNCHER, joined by --rendezvous and --key-file; fp32 within 1e-5 of one
# rank. launch_script.sh: the launcher a script is, with torchrun's variables.
cat > "$WORK/launch_script.sh" <<'EOF'
#!/usr/bin/env bash
for r in 0 1; do RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 "$@" & done
rc=0
for p in $(jobs -p); do wait "$p" || rc=1; done
exit $rc
EOF
chmod +x "$WORK/launch_script.sh"
outside() {
    local name=$1 ref dir; shift
    ref=$(ref_of fp32 "$DP2") dir="$WORK/$name"
    if [ ! -s "$ref" ]; then skip "$name: no one-rank run to compare with"; return; fi
    mkdir -p "$dir" && chmod 700 "$dir"
    (umask 077; python3 -c 'import secrets; print(secrets.token_hex(32))' > "$dir/job.key")
    run "$name" 90 "$@" ./train_gpt2cu_fp32 -x 10 -v 0 -s 0 $SMALL $DP2 -np 2 -hb 2 \
        --rendezvous "unix:$dir/rdv.sock" --key-file "$dir/job.key" -lg "$LOGS/$name.jsonl" &&
        nccl_ran nccl "$name" && compare 1e-5 "fp32 $name" "$ref" "$LOGS/$name.jsonl"
}

# ---------------------------------------------------------------------------
# NCCL where ranks share this GPU (-hb 2): the probe. dp 2, 4 and 8 over NCCL
# on the one GPU, 4 steps each, with NCCL's own log (NCCL_DEBUG=INFO): which
# sizes run, NCCL's version and transport, how many ranks read their
# NCCL_HOSTID, and a step's time. Phases 5 and 6 run NCCL cases of up to the
# most ranks that ran here (NCCL_RANKS). Should 2 ranks fail with InfiniBand
# in NCCL's log (its loopback between two "nodes" on one GPU), they are tried
# again over sockets (NCCL_IB_DISABLE=1), and the rest keeps that.
phase "the NCCL probe: 2, 4 and 8 ranks on this one GPU (-hb 2)" full
probe() {  # probe N [VAR=VALUE...]: dp N over NCCL, 4 steps; the trainer's exit status
    local n=$1; shift
    run "nccl_probe_np$n" 60 env NCCL_DEBUG=INFO "$@" ./train_gpt2cu -x 4 -v 0 -s 0 $SMALL $TINY -b 2 -t 16 \
        -d $((32 * n)) -np "$n" -hb 2 -to 20 -lg "$LOGS/nccl_probe_np$n.jsonl"
}
probe_report() {  # probe_report N: what NCCL's log and the step log say
    python3 - "$1" "$LOGS/nccl_probe_np$1.log" "$LOGS/nccl_probe_np$1.jsonl" <<'EOF' | tee -a "$SUMMARY"
import json, re, statistics, sys
n, log, steps = sys.argv[1], open(sys.argv[2], errors="replace").read(), sys.argv[3]
version = re.search(r"NCCL version (\S+)", log)
via = sorted(set(re.findall(r" via (\S+?)(?:/\d+)?(?:\s|$)", log)))
hostid = len(re.findall(r"NCCL_HOSTID set by environment to llm3d-", log))
try:
    ms = [r["ms"] for r in map(json.loads, open(steps)) if "loss" in r][1:]
    step = f"{statistics.median(ms):.1f} ms a step (median of steps 1-{len(ms)})" if ms else "no step times"
except (OSError, ValueError, KeyError):
    step = "no step log"
print(f"   {n} ranks: NCCL {version.group(1) if version else '?'}, transport {', '.join(via) or '?'}, "
      f"NCCL_HOSTID read by {hostid} of {n} ranks, {step}")
EOF
}
if [ $ON = 1 ] && [ -x ./train_gpt2cu ]; then
    for n in 2 4 8; do
        probe $n
        rc=$?
        if [ $rc -ne 0 ] && [ $rc -ne 77 ] && [ $n = 2 ] && grep -q 'NET/IB' "$LOGS/nccl_probe_np2.log"; then
            say "   2 ranks failed with InfiniBand in NCCL's log: again over sockets (NCCL_IB_DISABLE=1)"
            mv "$LOGS/nccl_probe_np2.log" "$LOGS/nccl_probe_np2_ib.log"
            probe 2 NCCL_IB_DISABLE=1
            rc=$?
            [ $rc -eq 0 ] && export NCCL_IB_DISABLE=1
        fi
        if [ $rc -ne 0 ]; then
            grep -q "Duplicate GPU" "$LOGS/nccl_probe_np$n.log" 2>/dev/null &&
                say "   NCCL refused $n ranks on one GPU (Duplicate GPU detected): it did not take their NCCL_HOSTID"
            break
        fi
        nccl_ran nccl "nccl_probe_np$n" || break
        NCCL_RANKS=$n
        probe_report $n
    done
    say "   NCCL cases below: up to $NCCL_RANKS ranks on this GPU"
fi

# ---------------------------------------------------------------------------
phase "bf16 against the PyTorch fixtures"
if [ -x ./test_gpt2cu ]; then run test_gpt2cu 120 ./test_gpt2cu; else skip "test_gpt2cu: not built"; fi

# ---------------------------------------------------------------------------
phase "benchmark: d12, T = 1024, 30 steps, random tokens"
python3 - "$WORK/bench_train_000000.bin" <<'EOF'
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
        mem_watch ours
        run "bench_B$B" 120 ./train_gpt2cu -e d12 -b $B -t 1024 -x 30 -v 0 -s 0 \
            -i "$WORK/bench_train_*.bin" -lg "$LOGS/bench_B$B.jsonl"
        rc=$?
        mem_peak ours > "$WORK/mem_ours.peak"
        if [ $rc -eq 0 ]; then BENCH_B=$B; break; fi
        grep -q "out of GPU memory" "$LOGS/bench_B$B.log" || break  # only memory is worth a smaller B
    done
fi
if [ -n "$BENCH_B" ]; then
    # gates: step 0 of a fresh model near ln(50257) = 10.825, the loss falling
    # (random tokens: towards ln 50257 from above), and the figures
    python3 - "$LOGS/bench_B$BENCH_B.jsonl" "$LOGS/bench_B$BENCH_B.log" "$WORK/ms_ours" > "$WORK/bench.txt" <<'EOF'
import json, math, re, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
ms = statistics.median(r["ms"] for r in rows[3:])  # steps 0-2 warm cuBLASLt up
tokens = rows[0]["tokens"]
mfu = [float(m) for m in re.findall(r"\| MFU ([0-9.]+)%", open(sys.argv[2]).read())[3:]]
mfu_s = f"{statistics.median(mfu):.1f}%" if mfu else "n/a"
first, last = rows[0]["loss"], rows[-1]["loss"]
near = abs(first - math.log(50257)) < 0.5
print(f"{'ok' if near else 'FAIL'} step 0 loss {first:.3f} (ln 50257 = {math.log(50257):.3f}, within 0.5)")
print(f"{'ok' if last < first else 'FAIL'} loss falls: {first:.3f} -> {last:.3f} over {len(rows)} steps")
print(f"figures train_gpt2cu B={sys.argv[1].split('_B')[-1].split('.')[0]}: ms/step {ms:.2f} tokens/s {tokens / ms * 1000:.0f} "
      f"MFU {mfu_s} (B*T = {tokens}, median of steps 3-{len(rows) - 1})")
open(sys.argv[3], "w").write(f"{ms:.3f} {mfu_s.rstrip('%')}\n")
EOF
    while read -r verdict rest; do
        case $verdict in ok) pass "$rest" ;; FAIL) fail "$rest" ;; *) say "   $rest" ;; esac
    done < "$WORK/bench.txt"
else
    fail "benchmark: train_gpt2cu did not run at any B (see bench_B*.log)"
fi
# llm.c's -lg N: a stats line from NVML every N steps (or one line saying
# NVML is absent); and the finite check before the final model is written
if [ -x ./train_gpt2cu ]; then
    run "gpu_stats" 90 ./train_gpt2cu -e d2 -b 4 -t 64 -x 4 -v 0 -s 0 -i "$WORK/bench_train_*.bin" -lg 2 \
        -o "$WORK/gpu_stats_out"
    n=$(grep -c '^gpu: compute ' "$LOGS/gpu_stats.log")
    nvml=$(want 'no GPU stats: NVML is absent' 'the CPU trainer has no GPU')  # a dry run's stand-in says this
    if [ "$n" -eq 2 ] || grep -q "$nvml" "$LOGS/gpu_stats.log"; then
        pass "-lg 2 over 4 steps: $n stats lines ($(grep -m1 -E "^gpu: |$nvml" "$LOGS/gpu_stats.log"))"
    else
        fail "-lg 2 over 4 steps: $n stats lines, want 2 (see gpu_stats.log)"
    fi
    if [ -f "$WORK/gpu_stats_out/DONE_00000004" ]; then pass "DONE_00000004 written after the final model"
    else fail "no DONE_00000004 in -o after 4 steps"; fi
fi

# ic_cost: the checked collectives' cost (-ic 1) against the same build with
# them off, over NCCL: d12, T = 1024, dp 2 (-hb 2, both ranks on this one
# GPU), each rank half the benchmark's B (the benchmark's tokens a step), 6
# steps, the median of steps 3-5. A measurement, not a gate: the ranks share
# one GPU and talk through NCCL's network transport, so the step is longer
# than on two GPUs and the ratio lower than there, and a run that fails
# (two d12 ranks may not fit one GPU's memory at that B) gives no figure
# rather than a FAIL; only the -ic 1 run's calls judged over NCCL are
# checked. About 30 s of device time, the last of phase 6's NCCL window, so
# that it takes none from phase 5's cases; host mode's (each step's
# gradients staged through the host) would take minutes, and is not run.
ic_cost() {
    local ic limit rc
    if [ "$QUICK" = 1 ]; then skip "-ic 1's cost at d12: QUICK=1"; return; fi
    if [ -z "$BENCH_B" ] || [ "$NCCL_RANKS" -lt 2 ] || [ ! -x ./train_gpt2cu ]; then
        skip "-ic 1's cost at d12: needs the benchmark's B (${BENCH_B:-none}) and 2 NCCL ranks (the probe ran $NCCL_RANKS)"
        return
    fi
    for ic in 0 1; do
        if ! limit=$(time_left 60); then skip "-ic 1's cost at d12: past the ${DEADLINE}s deadline"; return; fi
        timeout -k 5 "$limit" ./train_gpt2cu -e d12 -b $((BENCH_B / 2)) -t 1024 -d $((BENCH_B * 1024)) -np 2 -hb 2 \
            -ic $ic -x 6 -v 0 -s 0 -i "$WORK/bench_train_*.bin" -lg "$LOGS/bench_ic$ic.jsonl" > "$LOGS/bench_ic$ic.log" 2>&1
        rc=$?
        if [ $rc -ne 0 ]; then
            say "   -ic 1's cost at d12: no figure: the -ic $ic run exited $rc after at most ${limit}s (see bench_ic$ic.log)"
            return
        fi
    done
    nccl_ran nccl bench_ic0 && nccl_ran nccl bench_ic1 && checks_ran nccl bench_ic1
    python3 - "$LOGS/bench_ic0.jsonl" "$LOGS/bench_ic1.jsonl" "$((BENCH_B / 2))" <<'EOF' | while read -r line; do say "   $line"; done
import json, statistics, sys
try:
    ms = [statistics.median(r["ms"] for r in map(json.loads, open(p)) if "loss" in r and r["step"] >= 3) for p in sys.argv[1:3]]
except (OSError, ValueError, KeyError, statistics.StatisticsError) as e:
    print(f"-ic 1's cost at d12: no figure ({type(e).__name__})"); sys.exit(0)
print(f"-ic 1's cost at d12, B={sys.argv[3]} x dp 2 over NCCL on this one GPU, T=1024: -ic 0 {ms[0]:.2f} ms, "
      f"-ic 1 {ms[1]:.2f} ms a step (median of steps 3-5): {ms[1] / ms[0]:.4f}x (the goal on GPUs of their own: 1.02x)")
EOF
}

# ---------------------------------------------------------------------------
# over real NCCL (-hb 2), the ranks on this one GPU: what phase 7 runs in
# host mode, and what host mode cannot show: NCCL's collectives and
# messages, the MAC kernels and the step's tag swap, the watchdog, NCCL's
# wait clocks. Phases 5 and 6 keep to NCCL_UNTIL, not DEADLINE, and phase 5
# leaves phase 6 its last 50 s; the faults go first, each a path of its own.
phase "over NCCL (-hb 2): faults, layouts (fp32 within 1e-5, bf16 2e-2)" full
DEADLINE_ALL=$DEADLINE
DEADLINE=$((NCCL_UNTIL - 50))
if [ $ON = 1 ] && [ "$NCCL_RANKS" -lt 2 ]; then
    skip "NCCL faults and layouts: the probe ran no NCCL job of 2 ranks on this GPU"
elif [ $ON = 1 ]; then
    [ -x ./train_gpt2cu ] && faults nccl
    if [ -x ./train_gpt2cu_fp32 ]; then layouts fp32 1e-5 nccl; else skip "fp32 NCCL layouts: train_gpt2cu_fp32 not built"; fi
    [ -x ./train_gpt2cu ] && layouts_bf16 nccl
fi

# ---------------------------------------------------------------------------
phase "over NCCL (-hb 2): checkpoints of 8 ranks, SIGTERM, outside launchers" full
DEADLINE=$NCCL_UNTIL
if [ $ON = 1 ] && [ "$NCCL_RANKS" -lt 2 ]; then
    skip "NCCL checkpoints, SIGTERM and outside launchers: the probe ran no NCCL job of 2 ranks on this GPU"
elif [ $ON = 1 ]; then
    if [ ! -x ./train_gpt2cu_fp32 ]; then
        skip "NCCL checkpoints: train_gpt2cu_fp32 not built"
    elif nccl_fits nccl 8 "NCCL checkpoints of 8 ranks"; then
        W=8 background nccl_ckpt 1
        W=8 background nccl_ckpt 3
    fi
    [ -x ./train_gpt2cu_fp32 ] && W=2 background resume_across nccl
    if [ -x ./train_gpt2cu ] && nccl_fits nccl 8 "SIGTERM of 8 NCCL ranks"; then
        W=8 background sigterm_check nccl_term "$GRID -v 0 -s 0 $SMALL -np 8 -tp 2 -pp 2 -z 1 -hb 2"
    fi
    collect
    if [ -x ./train_gpt2cu_fp32 ]; then
        one_rank fp32 "$DP2"
        W=2 background outside outside_script "$WORK/launch_script.sh"
        if command -v torchrun > /dev/null; then
            W=2 background outside outside_torchrun torchrun --standalone --nnodes 1 --nproc-per-node 2 --no-python
        else
            skip "outside_torchrun: no torchrun here"
        fi
        if command -v mpirun > /dev/null && mpirun --version 2>&1 | grep -q "Open MPI"; then
            W=2 background outside outside_mpirun env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
                mpirun -np 2 --oversubscribe --bind-to none
        else
            skip "outside_mpirun: no Open MPI mpirun here"
        fi
        collect
    fi
    ic_cost
fi
DEADLINE=$DEADLINE_ALL

# ---------------------------------------------------------------------------
# host mode: the same layouts with the ranks sharing this GPU as they do by
# default, through the shared-memory host backend
phase "host mode: layouts (fp32 within 1e-5, bf16 2e-2), faults" full
if [ $ON = 1 ]; then
    if [ -x ./train_gpt2cu_fp32 ]; then
        layouts fp32 1e-5
        resume_across
    else
        skip "fp32 layouts: train_gpt2cu_fp32 not built"
    fi
    if [ -x ./train_gpt2cu ]; then
        faults
        layouts_bf16
    fi
fi

# ---------------------------------------------------------------------------
phase "fp32: fixtures, the CPU trainer, checkpoints across trainers" full
CROSS="-e d2 -ev 512 -et 64 -t 64 -b 4 -l 1e-3 -v 0 -s 0 $SMALL"
if [ $ON = 1 ] && [ -x ./test_gpt2cu_fp32 ]; then run test_gpt2cu_fp32 120 ./test_gpt2cu_fp32; fi
if [ $ON = 1 ] && [ -x ./train_gpt2cu_fp32 ] && [ -x ./train_gpt2 ]; then
    # the same 10 steps on both: losses within 1e-4
    run cross_gpu 60 ./train_gpt2cu_fp32 $CROSS -x 10 -lg "$LOGS/cross_gpu.jsonl" &&
    run cross_cpu 120 ./train_gpt2 $CROSS -x 10 -lg "$LOGS/cross_cpu.jsonl" &&
    compare 1e-4 "fp32 GPU against the CPU trainer, 10 steps" "$LOGS/cross_cpu.jsonl" "$LOGS/cross_gpu.jsonl"
    # a checkpoint of step 10 from each, resumed by the other for step 10: its
    # loss (a forward on the same weights and batch) within 2e-5
    run ck_gpu32 60 ./train_gpt2cu_fp32 $CROSS -x 11 -n 10 -o "$CK/g32" -lg "$LOGS/ck_gpu32.jsonl" &&
    run ck_gpu32_on_cpu 120 ./train_gpt2 $CROSS -x 11 -ys 10 -o "$CK/g32" -lg "$LOGS/ck_gpu32_on_cpu.jsonl" &&
    compare 2e-5 "the GPU's checkpoint resumed by the CPU trainer" "$LOGS/ck_gpu32.jsonl" "$LOGS/ck_gpu32_on_cpu.jsonl" resumed
    run ck_cpu 120 ./train_gpt2 $CROSS -x 11 -n 10 -o "$CK/cpu" -lg "$LOGS/ck_cpu.jsonl" &&
    run ck_cpu_on_gpu32 60 ./train_gpt2cu_fp32 $CROSS -x 11 -ys 10 -o "$CK/cpu" -lg "$LOGS/ck_cpu_on_gpu32.jsonl" &&
    compare 2e-5 "the CPU's checkpoint resumed by the GPU trainer" "$LOGS/ck_cpu.jsonl" "$LOGS/ck_cpu_on_gpu32.jsonl" resumed
fi

# ---------------------------------------------------------------------------
phase "NCCL with one rank; checkpoints and SIGTERM" full
NC="-e d2 -ev 512 -et 64 -t 64 -b 4 -x 8 -l 1e-3 -v 4 -m 2 -s 0 $SMALL"
if [ $ON = 1 ] && [ -x ./train_gpt2cu ]; then
    # bf16: ZeRO 1-3 of one rank against ZeRO-0; fp32: bit for bit
    for z in 0 1 2 3; do run nccl_z$z 60 ./train_gpt2cu $NC -np 1 -z $z -lg "$LOGS/nccl_z$z.jsonl"; done
    for z in 1 2 3; do compare 1e-2 "NCCL one rank, bf16 ZeRO-$z against ZeRO-0" "$LOGS/nccl_z0.jsonl" "$LOGS/nccl_z$z.jsonl"; done
    if [ -x ./train_gpt2cu_fp32 ]; then
        for z in 0 1 2 3; do run nccl32_z$z 60 ./train_gpt2cu_fp32 $NC -z $z -lg "$LOGS/nccl32_z$z.jsonl"; done
        for z in 1 2 3; do compare 0 "NCCL one rank, fp32 ZeRO-$z against ZeRO-0 (bit for bit)" "$LOGS/nccl32_z0.jsonl" "$LOGS/nccl32_z$z.jsonl"; done
    fi
    RES="-e d2 -ev 512 -et 64 -t 64 -b 4 -l 1e-3 -v 0 -s 0 $SMALL"
    mkdir -p "$CK/resumed"
    if run ck_full 60 ./train_gpt2cu $RES -x 20 -n 10 -o "$CK/full" -lg "$LOGS/ck_full.jsonl"; then
        cp -r "$CK/full/ckpt_00000010" "$CK/full/job.key" "$CK/resumed/"
        run ck_resumed 60 ./train_gpt2cu $RES -x 20 -n 10 -o "$CK/resumed" -y 1 -lg "$LOGS/ck_resumed.jsonl" &&
        compare 0 "resumed from step 10: the same losses and norms" "$LOGS/ck_full.jsonl" "$LOGS/ck_resumed.jsonl" resumed
        if cmp -s "$CK/full/ckpt_00000020/model.bin" "$CK/resumed/ckpt_00000020/model.bin" &&
           cmp -s "$CK/full/ckpt_00000020/optim.bin" "$CK/resumed/ckpt_00000020/optim.bin"; then
            pass "step 20's model.bin and optim.bin byte-identical, uninterrupted and resumed"
        else
            fail "step 20's checkpoint differs between the uninterrupted and the resumed run"
        fi
        # -enc 1: the same run with sealed checkpoints, bit for bit the plain
        # run's losses and norms, and resumed from its sealed step 10
        mkdir -p "$CK/enc_resumed"
        run ck_enc 60 ./train_gpt2cu $RES -x 20 -n 10 -enc 1 -o "$CK/enc" -lg "$LOGS/ck_enc.jsonl"
        enc_rc=$?
        [ $enc_rc -eq 0 ] &&
        compare 0 "-enc 1: the losses and norms of the run without -enc" "$LOGS/ck_full.jsonl" "$LOGS/ck_enc.jsonl" &&
        cp -r "$CK/enc/ckpt_00000010" "$CK/enc/job.key" "$CK/enc_resumed/" &&
        run ck_enc_resumed 60 ./train_gpt2cu $RES -x 20 -n 10 -enc 1 -o "$CK/enc_resumed" -y 1 -lg "$LOGS/ck_enc_resumed.jsonl" &&
        compare 0 "-enc 1, resumed from its sealed step 10: the plain run's losses and norms" "$LOGS/ck_full.jsonl" "$LOGS/ck_enc_resumed.jsonl" resumed
        if [ $enc_rc -eq 0 ]; then
            # the two checkpoints of the run that ended well, and the resumed
            # run's last one where it ran (its failure or skip said so)
            written=("$CK/enc/ckpt_00000010" "$CK/enc/ckpt_00000020")
            [ -d "$CK/enc_resumed/ckpt_00000020" ] && written+=("$CK/enc_resumed/ckpt_00000020")
            read -r plain nfiles < <(unsealed "${written[@]}")
            if [ $plain -eq 0 ]; then pass "-enc 1: model.bin, optim.bin and state.bin are sealed files (llm3dgcm) in the $((nfiles / 3)) checkpoints written"
            else fail "-enc 1: $plain of the $nfiles checkpoint files are not sealed"; fi
        fi
    fi
    sigterm_check ck_term "$RES"
fi

# ---------------------------------------------------------------------------
phase "kernel checks (bf16, fp32), compute-sanitizer at small shapes"
KERNELS="encoder layernorm attention classifier adamw gelu matmul mac"
for k in $KERNELS; do
    if [ -x "dev/cuda/${k}_check" ]; then run "${k}_check" 60 "dev/cuda/${k}_check"; else skip "${k}_check: not built"; fi
done
for k in $KERNELS; do
    [ -x "dev/cuda/${k}_fp32_check" ] && run "${k}_fp32_check" 60 "dev/cuda/${k}_fp32_check"
done
grep -h '^time ' "$LOGS"/*_check.log 2>/dev/null | sed 's/^/   /' >> "$SUMMARY"
# this machine's CPU: AES-GCM's paths as the checkpoints use them, the
# 512-bit VAES one too where the CPU has AVX-512 (a development machine
# without it skips that path)
[ -x dev/test/test_aead ] && run test_aead_this_cpu 60 ./dev/test/test_aead
if [ "$QUICK" = 1 ]; then
    skip "compute-sanitizer: QUICK=1"
elif command -v compute-sanitizer > /dev/null; then
    for tool in memcheck racecheck; do
        for k in $KERNELS; do
            [ -x "dev/cuda/${k}_check" ] || continue
            run "sanitizer_${tool}_$k" 60 env LLM3D_CHECK_SMALL=1 compute-sanitizer --tool $tool --error-exitcode 9 \
                "dev/cuda/${k}_check"
        done
    done
    # the fp32 build's kernels are other code (the FMA attention, no fused GELU)
    for k in $KERNELS; do
        [ -x "dev/cuda/${k}_fp32_check" ] || continue
        run "sanitizer_memcheck_${k}_fp32" 60 env LLM3D_CHECK_SMALL=1 compute-sanitizer --tool memcheck --error-exitcode 9 \
            "dev/cuda/${k}_fp32_check"
    done
else
    skip "compute-sanitizer: not on PATH"
fi

# ---------------------------------------------------------------------------
# the peers at the benchmark's B and T, one after the other on the same GPU:
# ms per step (the median of the steady steps), tokens/s, the peak GPU
# memory in use (mem_watch), and ours / theirs for each
phase "the peers: PyTorch and llm.c; -fa 0" full
if [ $ON = 1 ] && [ -n "$BENCH_B" ]; then
    if [ $HAVE_TORCH = 1 ]; then
        mem_watch torch
        run torch_bench 150 python3 dev/train_gpt2.py --bench --device cuda --compile --dtype-train bf16 \
            -B "$BENCH_B" -T 1024 --init d12 --steps 30
        rc=$?
        mem_peak torch > "$WORK/mem_torch.peak"
        [ $rc -eq 0 ] && grep -h '^bench:' "$LOGS/torch_bench.log" | head -n 1 | sed 's/.*ms\/step \([0-9.]*\).*/\1/' \
            > "$WORK/ms_torch"
    else
        skip "torch_bench: no PyTorch with CUDA here"
    fi
    if [ -n "$LLMC_WHY" ]; then
        skip "llm.c peer: $LLMC_WHY"
    else
        # llm.c's 124M recipe (scripts/run_gpt2_124M.sh) on one GPU: -r 0 -z 0,
        # no gradient accumulation; -v 1000 -m 1: one val batch at the first and
        # last step, outside its timed steps (its -v 0 divides by zero)
        mem_watch llmc
        run llmc_bench 150 env LD_LIBRARY_PATH="$LLMC_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$WORK/llmc/train_gpt2cu" \
            -i "$WORK/bench_train_*.bin" -j "$WORK/bench_train_000000.bin" -e d12 -b "$BENCH_B" -t 1024 \
            -d $((BENCH_B * 1024)) -r 0 -z 0 -l 0.0006 -u 700 -c 0.1 -x 30 -v 1000 -m 1 -s 0 -h 0
        rc=$?
        mem_peak llmc > "$WORK/mem_llmc.peak"
        # its step lines: "step N/M | loss | norm | lr | X ms | Y% bf16 MFU | Z tok/s"; the median from step 4
        [ $rc -eq 0 ] && python3 - "$LOGS/llmc_bench.log" > "$WORK/ms_llmc" <<'EOF'
import re, statistics, sys
steps = re.findall(r"^step +(\d+)/\d+ \|.*\| ([0-9.]+) ms \| ([0-9.]+)% bf16 MFU", open(sys.argv[1]).read(), re.M)
steady = [(float(ms), float(mfu)) for n, ms, mfu in steps if int(n) > 3]
if steady:
    print(f"{statistics.median(m for m, _ in steady):.3f} {statistics.median(f for _, f in steady):.1f}")
EOF
    fi
    python3 - "$WORK" "$BENCH_B" <<'EOF' | tee -a "$SUMMARY"
import os, sys
work, B = sys.argv[1], int(sys.argv[2])
def read(name):
    try: return open(os.path.join(work, name)).read().split()
    except OSError: return []
ours, ours_mem = read("ms_ours"), read("mem_ours.peak")
for name, label in (("ours", "train_gpt2cu"), ("torch", "PyTorch (torch.compile, bf16)"), ("llmc", "llm.c (cuDNN attention)")):
    ms, mem = read("ms_" + name), read("mem_" + name + ".peak")
    if not ms:
        print(f"   {label}: no figures")
        continue
    line = f"   {label:30s} ms/step {float(ms[0]):8.2f} tokens/s {B * 1024 / float(ms[0]) * 1000:8.0f}"
    line += f" MFU {ms[1]}%" if len(ms) > 1 else ""
    line += f" peak GPU memory {mem[0] if mem else 'n/a'} MiB"
    if name != "ours" and ours:
        line += f"; ours/{name}: ms {float(ours[0]) / float(ms[0]):.3f}"
        if ours_mem and mem and ours_mem[0].isdigit() and mem[0].isdigit() and int(mem[0]) > 0:
            line += f", memory {int(ours_mem[0]) / int(mem[0]):.3f}"
    print(line)
EOF
fi
if [ $ON = 1 ] && [ -n "$BENCH_B" ]; then
    run "bench_fa0" 90 ./train_gpt2cu -e d12 -b "$BENCH_B" -t 1024 -x 12 -v 0 -s 0 -fa 0 \
        -i "$WORK/bench_train_*.bin" -lg "$LOGS/bench_fa0.jsonl" &&
    python3 - "$LOGS/bench_fa0.jsonl" <<'EOF' | tee -a "$SUMMARY"
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
ms = statistics.median(r["ms"] for r in rows[3:])
print(f"   train_gpt2cu -fa 0: ms/step {ms:.2f} tokens/s {rows[0]['tokens'] / ms * 1000:.0f}")
EOF
fi

# ---------------------------------------------------------------------------
# where the time goes: every kernel of two d12 steps at the benchmark's B,
# timed one at a time by Nsight Compute, summed by name. A measurement, not a
# gate: without ncu, or where it cannot read the GPU, it is skipped.
phase "profile: a d12 step's kernels (ncu)"
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | sort -V | tail -n 1)
if [ -z "$BENCH_B" ]; then skip "profile: no benchmark B"
elif [ -z "$NCU" ]; then skip "profile: no ncu"
elif ! limit=$(time_left 120); then skip "profile: past the ${DEADLINE}s deadline"
else
    timeout -k 5 "$limit" "$NCU" --clock-control none --metrics gpu__time_duration.sum --csv \
        --kernel-name-base function --log-file "$LOGS/profile.csv" \
        ./train_gpt2cu -e d12 -b "$BENCH_B" -t 1024 -x 2 -v 0 -s 0 -i "$WORK/bench_train_*.bin" \
        > "$LOGS/profile.log" 2>&1
    rc=$?
    if python3 - "$LOGS/profile.csv" > "$WORK/profile.txt" <<'EOF'
import csv, sys
scale = {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0, "msecond": 1.0, "s": 1e3, "second": 1e3}
rows = [l for l in open(sys.argv[1]) if l.startswith('"')]
ms, calls = {}, {}
for r in csv.DictReader(rows):
    if r.get("Metric Name") != "gpu__time_duration.sum" or r.get("Metric Unit") not in scale: continue
    name = r["Kernel Name"][:90]
    ms[name] = ms.get(name, 0.0) + float(r["Metric Value"].replace(",", "")) * scale[r["Metric Unit"]]
    calls[name] = calls.get(name, 0) + 1
total = sum(ms.values())
if total == 0: sys.exit(1)
gemm = sum(v for k, v in ms.items() if any(w in k.lower() for w in ("gemm", "xmma", "cutlass", "nvjet", "sm90")))
print(f"   {sum(calls.values())} kernels, {total:.1f} ms of GPU time over 2 steps (init included); GEMMs {100 * gemm / total:.1f}%")
for k in sorted(ms, key=ms.get, reverse=True)[:15]:
    print(f"   {100 * ms[k] / total:5.1f}% {ms[k] / 2:8.2f} ms/step {calls[k]:5d} calls  {k}")
EOF
    then
        # a run cut short still says where its time went, as a skip
        if [ $rc -eq 0 ]; then pass "profile (ncu): the kernels of 2 steps at B=$BENCH_B"
        else skip "profile: ncu exited $rc (timed out?): the kernels it timed before that"; fi
        tee -a "$SUMMARY" < "$WORK/profile.txt"
    else skip "profile: ncu gave no kernel times (exit $rc): $(cat "$LOGS/profile.log" "$LOGS/profile.csv" 2>/dev/null | grep -m1 -iE 'error|fail' | cut -c1-120)"
    fi
fi

# ---------------------------------------------------------------------------
# pipeline_bars TABLE: the bars on the bench's rows "schedule measured
# simulated share"; a share is of 1f1b's measured bubble, so without a 1f1b
# row above 0, or with a share not above 0 (n/a), the bars have no base and
# fail, as does a schedule with a bar and no row
pipeline_bars() {
    local sched measured simulated share bar base
    base=$(awk '$1 == "1f1b" { print $2; exit }' "$1")
    if ! awk -v m="${base:-x}" 'BEGIN { exit !(m ~ /^[0-9.]+$/ && m + 0 > 0) }'; then
        fail "pipeline bubbles: 1f1b's measured bubble is ${base:-missing (no 1f1b row)}: no base for the bars"
        return
    fi
    for sched in interleaved zbh1 zbv; do
        grep -q "^$sched " "$1" || fail "pipeline bubble of $sched: no row in the bench's table"
    done
    while read -r sched measured simulated share; do
        case $sched in zbh1) bar=0.5 ;; interleaved) bar=0.6 ;; zbv) bar=0.25 ;; *) continue ;; esac
        if ! awk -v r="$share" 'BEGIN { exit !(r ~ /^[0-9.]+$/ && r + 0 > 0) }'; then
            fail "pipeline bubble of $sched: a share of 1f1b's of $share (1f1b's $base): not measured"
        elif awk -v m="$measured" -v s="$simulated" -v r="$share" -v b="$bar" \
            'BEGIN { d = m - s; if (d < 0) d = -d; exit !(r <= b && d <= 0.05) }'; then
            pass "pipeline bubble of $sched: $measured measured, $simulated simulated, $share of 1f1b's (bar $bar)"
        else
            fail "pipeline bubble of $sched: $measured measured, $simulated simulated, $share of 1f1b's (bar $bar, within 0.05)"
        fi
    done < "$1"
}

# the pipeline schedules' bubbles, measured where there are cores enough: the
# CPU trainer's ranks, one thread each, at pp 4 with 8 micro-batches. Two
# ranks on one core wait for each other's time slices and count it as
# bubble, so it needs twice pp cores (the NCCL phases are over by now). The
# bars: zbh1's measured bubble at most half of 1f1b's, interleaved (-pv 2)
# at most 0.6, zbv at most a quarter, each within 5 points of what the
# simulator gives for the op costs measured in the same run.
phase "pipeline bubbles on this machine's CPU cores" full
if [ $ON = 1 ]; then
    if [ ! -x ./train_gpt2 ]; then skip "pipeline bubbles: train_gpt2 not built"
    elif [ "$(nproc)" -lt 8 ] && [ "${PIPE_BENCH:-0}" != 1 ]; then skip "pipeline bubbles: $(nproc) cores, 8 needed"
    elif run pipeline_bench 100 env PP=4 M=8 STEPS=4 ROUNDS=2 ./dev/bench_pipeline.sh; then
        # the bench's bubble table: "schedule measured simulated formula of-1f1b's op costs" (its memory
        # table's rows, "schedule stage sets ...", have a whole number second)
        awk '$1 ~ /^(gpipe|1f1b|interleaved|zbh1|zbv)$/ && NF >= 5 && $2 ~ /^[0-9]+[.][0-9]+$/ && $3 ~ /^-?[0-9]+[.][0-9]+$/ { print $1, $2, $3, $5 }' \
            "$LOGS/pipeline_bench.log" > "$WORK/bubbles.txt"
        sed 's/^/   /' "$WORK/bubbles.txt" | tee -a "$SUMMARY" > /dev/null
        pipeline_bars "$WORK/bubbles.txt"
    fi
fi
finish
