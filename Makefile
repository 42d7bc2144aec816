# llm3d: `make` builds everything this machine can build (the CPU programs
# always, the CUDA ones when nvcc is found); `make test` runs the CPU tests and
# ends with "N passed, N failed, N skipped"; `make run` is the quick start.

CC ?= gcc
CFLAGS ?= -O3 -march=native
# -fno-math-errno: sqrtf may then be one vector instruction (AdamW); results do not change
CFLAGS += -std=gnu11 -Wall -Wextra -Wno-unused-function -fno-math-errno
LDLIBS = -lm

# SIMD: which vector code the CPU programs use. native (the default): what
# this machine has; avx2: AVX2 even where AVX-512 is there; scalar: plain
# loops and libm (cpu_math.h, cpu_matmul.h). `make test` also builds and runs
# test_gpt2 in the other two, and test_integrity's sketches in scalar, so
# every path is tested.
SIMD ?= native
X86 := $(if $(findstring x86_64,$(shell $(CC) -dumpmachine)),yes)
AVX2_FLAGS = -mno-avx512f
# scalar: no fused multiply-adds either. The compiler fuses a * b + c in
# some copies of the plain loops and not in others, so a matmul's edge tiles
# rounded unlike its full ones; unfused, every loop rounds the same way.
SCALAR_FLAGS = -DLLM3D_SCALAR -ffp-contract=off
ifeq ($(SIMD),avx2)
  CFLAGS += $(AVX2_FLAGS)
else ifeq ($(SIMD),scalar)
  CFLAGS += $(SCALAR_FLAGS)
else ifneq ($(SIMD),native)
  $(error SIMD=$(SIMD): give native, avx2 or scalar)
endif

# OpenMP when the compiler has it; the CPU trainer also builds without
OPENMP := $(shell echo 'int main(void){return 0;}' | $(CC) -fopenmp -x c - -o /dev/null 2>/dev/null && echo yes)
ifeq ($(OPENMP),yes)
  CFLAGS += -fopenmp
else
  $(warning OpenMP not found: the CPU trainer builds single-threaded)
endif

# OpenSSL's libcrypto when its header and library are found: test_aead then
# checks aead.h's AES-256-GCM against OpenSSL's on the same inputs
OPENSSL := $(shell printf '\043include <openssl/evp.h>\nint main(void){return EVP_aes_256_gcm() == 0;}\n' | \
             $(CC) -x c - -lcrypto -o /dev/null 2>/dev/null && echo yes)

# CUDA when nvcc is found: sm_80 (A100) and sm_90 (H100/H200)
NVCC := $(shell command -v nvcc 2>/dev/null)
# LLM3D_NCCL: nccl_comm.h's NCCL backend, for data parallel across GPUs
NVCC_FLAGS = -O3 -std=c++17 -I. -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 -DLLM3D_NCCL
NVCC_LDLIBS = -lcublas -lcublasLt -lnccl -ldl
PRECISION ?= BF16
ifeq ($(PRECISION),FP32)
  NVCC_FLAGS += -DENABLE_FP32
endif

# Programs stay at the root where the docs call them (./train_gpt2,
# ./prepare_data); tests and tools build beside their sources under dev/.
CPU_PROGRAMS = train_gpt2 prepare_data export_hf plot_log dev/bench_secure dev/bench_aead dev/bench_matmul \
               dev/bench_kernels dev/bench_sketch dev/bench_tokenizer dev/pipeline_chart dev/compare_logs
CPU_TESTS = test_gpt2 $(addprefix dev/test/,test_secure test_aead test_dataloader test_tokenizer test_parallel \
            test_layouts test_integrity test_checkpoint test_prepare_data test_export test_plot test_hellaswag test_llmc \
            test_attacks test_gpt2_scalar test_integrity_scalar $(if $(X86),test_gpt2_avx2))
CUDA_PROGRAMS = train_gpt2cu test_gpt2cu dev/test/test_host_mode

ifneq ($(NVCC),)
all: $(CPU_PROGRAMS) $(CPU_TESTS) $(CUDA_PROGRAMS)
else
all: $(CPU_PROGRAMS) $(CPU_TESTS)
	@echo "nvcc not found: skipping $(CUDA_PROGRAMS)"
endif

# every include is a path from the root
CFLAGS += -I.
HEADERS = $(wildcard *.h llm3d/*.h llm3d/*/*.h llm3d/*/*/*.h)
CUDA_HEADERS = $(wildcard llm3d/cuda/*.cuh llm3d/cuda/*/*.cuh)
TEST_HEADERS = dev/test/test.h dev/test/test_run.h dev/test/test_child.h

train_gpt2: train_gpt2.c $(HEADERS)
	$(CC) $(CFLAGS) $< $(LDLIBS) -o $@

prepare_data: dev/data/prepare_data.c dev/data/prepare_hellaswag.h $(HEADERS)
	$(CC) $(CFLAGS) -pthread $< $(LDLIBS) -o $@

export_hf: dev/eval/export_hf.c $(HEADERS)
	$(CC) $(CFLAGS) $< $(LDLIBS) -o $@

plot_log: dev/plot_log.c llm3d/errors.h llm3d/files.h llm3d/json.h llm3d/log_reader.h
	$(CC) $(CFLAGS) $< $(LDLIBS) -o $@

dev/bench_%: dev/bench_%.c dev/bench.h train_gpt2.c $(HEADERS)
	$(CC) $(CFLAGS) $< $(LDLIBS) -o $@

dev/compare_logs: dev/compare_logs.c llm3d/errors.h llm3d/files.h llm3d/json.h llm3d/log_reader.h
	$(CC) $(CFLAGS) $< $(LDLIBS) -o $@

dev/pipeline_chart: dev/pipeline_chart.c $(HEADERS)
	$(CC) $(CFLAGS) $< $(LDLIBS) -o $@

test_gpt2: test_gpt2.c train_gpt2.c $(TEST_HEADERS) $(HEADERS)
	$(CC) $(CFLAGS) $< $(LDLIBS) -o $@

dev/test/test_%: dev/test/test_%.c $(TEST_HEADERS) $(HEADERS)
	$(CC) $(CFLAGS) $< $(LDLIBS) -o $@

dev/test/test_hellaswag: train_gpt2.c dev/data/prepare_hellaswag.h

dev/test/test_aead: dev/test/test_aead.c $(TEST_HEADERS) $(HEADERS)
	$(CC) $(CFLAGS) $(if $(OPENSSL),-DLLM3D_OPENSSL) $< $(LDLIBS) $(if $(OPENSSL),-lcrypto) -o $@

# test_gpt2 on the other vector paths (see SIMD above)
dev/test/test_gpt2_avx2: test_gpt2.c train_gpt2.c $(TEST_HEADERS) $(HEADERS)
	$(CC) $(CFLAGS) $(AVX2_FLAGS) $< $(LDLIBS) -o $@

dev/test/test_gpt2_scalar: test_gpt2.c train_gpt2.c $(TEST_HEADERS) $(HEADERS)
	$(CC) $(CFLAGS) $(SCALAR_FLAGS) $< $(LDLIBS) -o $@

# sketch.h's plain loops (SIMD=scalar builds) against the same definition
dev/test/test_integrity_scalar: dev/test/test_integrity.c $(TEST_HEADERS) $(HEADERS)
	$(CC) $(CFLAGS) $(SCALAR_FLAGS) $< $(LDLIBS) -o $@

train_gpt2cu: train_gpt2.cu $(HEADERS) $(CUDA_HEADERS)
	$(NVCC) $(NVCC_FLAGS) $< $(NVCC_LDLIBS) -o $@

test_gpt2cu: test_gpt2.cu train_gpt2.cu $(TEST_HEADERS) $(HEADERS) $(CUDA_HEADERS)
	$(NVCC) $(NVCC_FLAGS) $< $(NVCC_LDLIBS) -o $@

# the fp32 builds, as dev/gpu_check.sh runs them beside the bf16 ones
train_gpt2cu_fp32: train_gpt2.cu $(HEADERS) $(CUDA_HEADERS)
	$(NVCC) $(NVCC_FLAGS) -DENABLE_FP32 $< $(NVCC_LDLIBS) -o $@

test_gpt2cu_fp32: test_gpt2.cu train_gpt2.cu $(TEST_HEADERS) $(HEADERS) $(CUDA_HEADERS)
	$(NVCC) $(NVCC_FLAGS) -DENABLE_FP32 $< $(NVCC_LDLIBS) -o $@

# nccl_comm.h's host mode under the test's stand-in CUDA runtime (no GPU
# needed): libcudart shared, so the test's own cudaMemcpyAsync and the rest
# take the place of the library's (found through the toolkit's lib64); no
# device code runs, so PTX for one arch
dev/test/test_host_mode: dev/test/test_host_mode.cu $(TEST_HEADERS) $(HEADERS)
	$(NVCC) -O2 -std=c++17 -I. -gencode arch=compute_80,code=compute_80 -cudart shared \
		-Xlinker -rpath -Xlinker $(dir $(NVCC))../lib64 $< -lnccl -o $@

# with nvcc, test_gpt2cu too: its host-side checks (flags, files, layouts)
# run anywhere, and its GPU checks say they skip when there is no device;
# and test_host_mode, which needs no device at all
ifneq ($(NVCC),)
  TESTS = $(CPU_TESTS) test_gpt2cu dev/test/test_host_mode
  TEST_DEPS = train_gpt2 prepare_data export_hf plot_log dev/compare_logs dev/pipeline_chart train_gpt2cu
else
  TESTS = $(CPU_TESTS)
  TEST_DEPS = train_gpt2 prepare_data export_hf plot_log dev/compare_logs dev/pipeline_chart
endif

test: $(TESTS) $(TEST_DEPS)
	@./dev/test/run_tests.sh $(addprefix ./,$(TESTS))

# fuzz targets (clang with libFuzzer); `make fuzz` replays the corpora and
# runs each target for FUZZ_SECONDS
FUZZERS = dev/fuzz/fuzz_frame dev/fuzz/fuzz_manifest dev/fuzz/fuzz_shard dev/fuzz/fuzz_bpe
FUZZ_SECONDS ?= 10
dev/fuzz/fuzz_%: dev/fuzz/fuzz_%.c $(HEADERS)
	clang -g -O1 -fsanitize=fuzzer,address -I. $< -lm -o $@

fuzz: $(FUZZERS)
	@./dev/run_fuzz.sh $(FUZZ_SECONDS) $(FUZZERS)

bench: train_gpt2 prepare_data dev/bench_secure dev/bench_aead dev/bench_matmul dev/bench_kernels dev/bench_sketch
	./dev/bench_cpu.sh
	./dev/bench_kernels
	./dev/bench_sketch
	./dev/bench_secure
	./dev/bench_aead
	./dev/bench_checkpoint.sh

# mutation testing (README, Contributing): dev/mutate/mutate.sh plants each
# mutant of dev/mutate/mutants.txt in a copy of the tree and runs the tests
# that should kill it. About an hour on two cores: not part of `make test` or CI.
# MUTANTS=a,b runs those; QUICK=1 leaves out the slowest test programs.
mutate:
	@MUTANTS="$(MUTANTS)" QUICK="$(QUICK)" ./dev/mutate/mutate.sh

clean:
	rm -f $(CPU_PROGRAMS) $(CPU_TESTS) $(CUDA_PROGRAMS) train_gpt2cu_fp32 test_gpt2cu_fp32 $(FUZZERS)

run: train_gpt2 prepare_data plot_log
	./dev/run.sh

.PHONY: all test fuzz bench clean run mutate
