/*
 * host_io.c: dataloader.h and tokenizer.h compiled as C for the CUDA
 * trainer (see host_io.h). Every function is a thin forward; the error
 * messages are the loader's and tokenizer's own.
 */
#include "../../dataloader.h"
#include "../../tokenizer.h"
#include "host_io.h"

struct HostLoader { DataLoader dl; };
struct HostTokenizer { Tokenizer tok; };

HostLoader *host_loader_open(const char *pattern, int B, int T, int shuffle, uint64_t seed, int vocab_size,
                             char *err, size_t errlen) {
    HostLoader *l = (HostLoader *)malloc(sizeof(HostLoader));
    if (l == NULL) {
        snprintf(err, errlen, "%s: out of memory for the data loader", pattern);
        return NULL;
    }
    if (dataloader_init(&l->dl, pattern, B, T, 0, 1, shuffle, seed, vocab_size, err, errlen) != 0) {
        free(l);
        return NULL;
    }
    return l;
}

int host_loader_next(HostLoader *loader, int *inputs, int *targets) { return dataloader_next(&loader->dl, inputs, targets); }
void host_loader_reset(HostLoader *loader) { dataloader_reset(&loader->dl); }
long host_loader_batches_per_epoch(const HostLoader *loader) { return dataloader_batches_per_epoch(&loader->dl); }

void host_loader_close(HostLoader *loader) {
    if (loader == NULL) return;
    dataloader_free(&loader->dl);
    free(loader);
}

HostTokenizer *host_tokenizer_open(const char *path, char *err, size_t errlen) {
    HostTokenizer *t = (HostTokenizer *)malloc(sizeof(HostTokenizer));
    if (t == NULL) {
        snprintf(err, errlen, "%s: out of memory for the tokenizer", path);
        return NULL;
    }
    if (tokenizer_load_bin(&t->tok, path, err, errlen) != 0) {
        free(t);
        return NULL;
    }
    return t;
}

const char *host_tokenizer_decode(const HostTokenizer *tok, int id, int *len) { return tokenizer_decode(&tok->tok, id, len); }
int host_tokenizer_eot(const HostTokenizer *tok) { return tok->tok.eot_token; }

void host_tokenizer_close(HostTokenizer *tok) {
    if (tok == NULL) return;
    tokenizer_free(&tok->tok);
    free(tok);
}
