/*
 * parallel.h: everything a trainer or a test needs to run as one rank of
 * many, in one include.
 *
 * defines: nothing itself; the pieces live in flat files under
 * llm3d/parallel/, each including what it uses, listed here in dependency
 * order:
 *
 *   grid.h       the rank grid (world = dp x pp x tp) and this rank's groups
 *   pipeline.h   the pipeline schedules, their message plans, the simulator
 *                and the checker that plays the plans with blocking sends
 *   rendezvous.h the authenticated rendezvous and the shared-memory
 *                segment it hands out
 *   launcher.h   the launcher, parallel_main and parallel_join
 *   shm_comm.h   the host backend: collectives and point-to-point messages
 *                between the ranks of one box, through that segment
 *   nccl_comm.h  which GPU a rank binds to, the MAC'd messages' headers, and
 *                the NCCL backend (CUDA builds, -DLLM3D_NCCL), with its host
 *                mode (host_mode.h) for ranks that share a GPU
 *
 * doc/parallel.md is the long form: the grid formula with an example, the
 * launch and rendezvous sequence, the shared-memory layout, the collective
 * algorithms and their byte counts, the schedules, the timeouts.
 *
 * C and C++. These headers compile as C11 (the CPU programs) and as C++17
 * (nvcc's host compiler, for train_gpt2.cu): shared-memory fields are plain
 * integers under GCC's __atomic builtins, no compound literals.
 */
#ifndef LLM3D_PARALLEL_H
#define LLM3D_PARALLEL_H

#include "llm3d/parallel/grid.h"
#include "llm3d/parallel/pipeline.h"
#include "llm3d/parallel/rendezvous.h"
#include "llm3d/parallel/launcher.h"
#include "llm3d/parallel/shm_comm.h"
#include "llm3d/parallel/nccl_comm.h"

#endif
