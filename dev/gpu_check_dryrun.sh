#!/usr/bin/env bash
# dev/gpu_check_dryrun.sh: dev/gpu_check.sh end to end on a machine with no
# GPU, to find the script's own mistakes before a short GPU slot is spent on
# them. Stand-ins on PATH: nvidia-smi reports one "Fake H200"; nvcc writes,
# for every trainer it is asked to build, a wrapper that runs the CPU
# trainer with the same flags (less the GPU-only -hb, -r, -fa, with their
# values: -hb 1 or 2 alike), and for every test or kernel check a program
# that prints one passing line. So the layouts, faults, checkpoints and
# comparisons run for real on the CPU trainer, the NCCL phases (-hb 2) too,
# over its host backend: DRYRUN=1 tells gpu_check.sh to look there for the
# host backend's lines where it wants NCCL's, and torchrun and mpirun count
# as missing unless the machine has them. The d12 benchmark fails on purpose
# (too slow on a CPU); NCCL comes from the system or the script's search.
#
#   ./dev/gpu_check_dryrun.sh     # summary in /tmp/llm3d_gpu_dryrun/out/summary.txt
set -u
cd "$(dirname "$0")/.."
make -s train_gpt2 prepare_data || exit 1
top=/tmp/llm3d_gpu_dryrun
rm -rf "$top"
mkdir -p "$top/bin" "$top/out"
git worktree add -q --detach "$top/repo" HEAD || exit 1
cp dev/gpu_check.sh "$top/repo/dev/"  # the script as it is now, committed or not
cp train_gpt2 prepare_data "$top/repo/"
cat > "$top/bin/nvidia-smi" <<'SMI'
#!/usr/bin/env bash
case "$*" in
    -L) echo "GPU 0: Fake H200 (UUID: GPU-0)" ;;
    *name*compute_cap*) echo "Fake H200, 143771 MiB, 0.0, 9.0" ;;
    *compute_cap*) echo "9.0" ;;
esac
SMI
cat > "$top/bin/nvcc" <<'NVCC'
#!/usr/bin/env bash
[ "${1:-}" = "--version" ] && { echo "Cuda compilation tools (stand-in for a dry run)"; exit 0; }
out="" prev=""
for a in "$@"; do [ "$prev" = "-o" ] && out=$a; prev=$a; done
case "$out" in
    *train_gpt2cu*) cat > "$out" <<WRAP
#!/usr/bin/env bash
args=() drop=0
for a in "\$@"; do
    if [ \$drop = 1 ]; then drop=0; continue; fi
    case \$a in -hb|-r|-fa) drop=1 ;; d12) echo "dry run: no d12 on a CPU"; exit 1 ;; *) args+=("\$a") ;; esac
done
exec $PWD/train_gpt2 "\${args[@]}"
WRAP
    ;;
    *) printf '#!/usr/bin/env bash\necho "ok    dry run"\necho "1 passed, 0 failed, 0 skipped"\n' > "$out" ;;
esac
chmod +x "$out"
NVCC
chmod +x "$top/bin/"*
# no llm.c peer: the nvcc stand-in would build it as a CPU trainer
(cd "$top/repo" && env -u LLMC_DIR PATH="$top/bin:$PATH" OUT="$top/out" DRYRUN=1 ./dev/gpu_check.sh)
rc=$?
git worktree remove --force "$top/repo"
echo "gpu_check_dryrun: gpu_check exited $rc; its summary: $top/out/summary.txt"
