/*
 * host_io.h: the GPU trainer's door to the C-only host code (dataloader.h,
 * tokenizer.h and the secure.h they pull in). Those headers are C11 and do
 * not compile as C++, so host_io.c compiles them as C and hands the CUDA
 * trainer opaque handles. If they ever become C++-clean, train_gpt2.cu can
 * include them directly and this pair of files can go.
 */
#ifndef LLM3D_HOST_IO_H
#define LLM3D_HOST_IO_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct HostLoader HostLoader;        // a DataLoader
typedef struct HostTokenizer HostTokenizer;  // a Tokenizer

// dataloader_init for one data-parallel rank of one; NULL with err set on failure
HostLoader *host_loader_open(const char *pattern, int B, int T, int shuffle, uint64_t seed, int vocab_size,
                             char *err, size_t errlen);
int host_loader_next(HostLoader *loader, int *inputs, int *targets);
void host_loader_reset(HostLoader *loader);
long host_loader_batches_per_epoch(const HostLoader *loader);
void host_loader_close(HostLoader *loader);

HostTokenizer *host_tokenizer_open(const char *path, char *err, size_t errlen);
const char *host_tokenizer_decode(const HostTokenizer *tok, int id, int *len);
int host_tokenizer_eot(const HostTokenizer *tok);
void host_tokenizer_close(HostTokenizer *tok);

#ifdef __cplusplus
}
#endif

#endif
