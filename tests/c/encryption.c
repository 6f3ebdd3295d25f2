/*
 * ncclSetEncryption from C: ranks with one PSK and no shared memory
 * between them (NCCL_SHM_DISABLE=1: processes talk over TCP) run an
 * all-reduce and an all-gather, every element checked, at 2 and 4 ranks:
 *
 *   encryption threads        ranks as threads of this process, host memory
 *   encryption processes      ranks as processes, host memory
 *   encryption emu            ranks as threads, on the emulated GPU
 *   encryption emu-processes  ranks as processes, on the emulated GPU
 *   encryption wrong-key      2 processes, rank 1 with another key: it is
 *                             refused at bootstrap naming the root's
 *                             address, and the root fails at its timeout
 *                             naming the rank that never registered
 *
 * (the misuses of ncclSetEncryption are suite.c's `encryption` case).
 * Exit status 0 means it passed.
 */
#define _POSIX_C_SOURCE 200809L
#include <nccl.h>
#include <rcclrs_emu.h>

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ranks.h"

#define KEY "a-job-wide-key-of-at-least-32-bytes!"
#define OTHER_KEY "another-key-of-at-least-32-bytes-long"
#define LEN (1 << 16)
#define MAX_RANKS 4

static void use_key(const char *key) {
  ncclEncryptionConfig_t psk = NCCL_ENCRYPTION_CONFIG_INITIALIZER;
  psk.mode = NCCL_ENCRYPTION_MODE_PSK;
  psk.psk = key;
  CHECK(ncclSetEncryption(&psk));
}

struct rank {
  ncclComm_t comm;
  int rank, nranks, on_device;
};

/* Buffers of `bytes` on the rank's memory (host or device). */
static void *alloc_on(const struct rank *x, size_t bytes) {
  void *p = NULL;
  if (x->on_device)
    CHECK(ncclMemAlloc(&p, bytes));
  else if (!(p = malloc(bytes)))
    abort();
  return p;
}

static void free_on(const struct rank *x, void *p) {
  if (x->on_device)
    CHECK(ncclMemFree(p));
  else
    free(p);
}

/* Rank r gives r * 100000 + i: all-reduce sums, all-gather concatenates. */
static void *exchange(void *arg) {
  const struct rank *x = arg;
  int n = x->nranks;
  size_t bytes = LEN * sizeof(int32_t);
  int32_t *host = malloc(bytes * n);
  int32_t *in = alloc_on(x, bytes), *sum = alloc_on(x, bytes), *all = alloc_on(x, bytes * n);
  cudaStream_t stream = NULL;
  for (int i = 0; i < LEN; i++) host[i] = x->rank * 100000 + i;
  if (x->on_device) {
    CHECK(rcclrsEmuStreamCreate(&stream));
    CHECK(rcclrsEmuMemcpy(in, host, bytes));
  } else {
    memcpy(in, host, bytes);
  }
  CHECK(ncclAllReduce(in, sum, LEN, ncclInt32, ncclSum, x->comm, stream));
  CHECK(ncclAllGather(in, all, LEN, ncclInt32, x->comm, stream));
  const int32_t *got_sum = sum, *got_all = all;
  if (x->on_device) {
    CHECK(rcclrsEmuStreamSynchronize(stream));
    int32_t *copy = malloc(bytes * (n + 1));
    CHECK(rcclrsEmuMemcpy(copy, sum, bytes));
    CHECK(rcclrsEmuMemcpy(copy + LEN, all, bytes * n));
    got_sum = copy;
    got_all = copy + LEN;
  }
  int bad = 0;
  for (int i = 0; i < LEN; i++) bad += got_sum[i] != 100000 * n * (n - 1) / 2 + n * i;
  for (int p = 0; p < n; p++)
    for (int i = 0; i < LEN; i++) bad += got_all[p * LEN + i] != p * 100000 + i;
  EXPECT(bad == 0);
  if (x->rank == 0)
    printf("%d ranks%s over TCP with a PSK: %d + %d elements checked\n", n,
           x->on_device ? " on the emulated GPU" : "", LEN, n * LEN);
  if (x->on_device) {
    free((void *)got_sum);
    CHECK(rcclrsEmuStreamDestroy(stream));
  }
  free_on(x, in);
  free_on(x, sum);
  free_on(x, all);
  free(host);
  return NULL;
}

static void on_threads(int n, int on_device) {
  ncclComm_t comms[MAX_RANKS];
  struct rank ranks[MAX_RANKS];
  pthread_t th[MAX_RANKS];
  CHECK(ncclCommInitAll(comms, n, NULL));
  for (int r = 0; r < n; r++) {
    ranks[r] = (struct rank){comms[r], r, n, on_device};
    pthread_create(&th[r], NULL, exchange, &ranks[r]);
  }
  for (int r = 0; r < n; r++) pthread_join(th[r], NULL);
  for (int r = 0; r < n; r++) CHECK(ncclCommDestroy(comms[r]));
}

static void keyed_setup(int r, void *unused) {
  (void)r, (void)unused;
  use_key(KEY);
}

static void process_rank(int r, int n, ncclUniqueId id, void *on_device) {
  struct rank x = {NULL, r, n, *(int *)on_device};
  CHECK(ncclCommInitRank(&x.comm, n, id, r));
  exchange(&x);
  CHECK(ncclCommDestroy(x.comm));
}

/* Rank 1 holds another key; both sides wait at most 3 s. */
static void wrong_key_setup(int r, void *unused) {
  (void)unused;
  setenv("RCCL_TIMEOUT_MS", "3000", 1);
  use_key(r == 1 ? OTHER_KEY : KEY);
}

static void wrong_key_rank(int r, int n, ncclUniqueId id, void *unused) {
  (void)unused;
  ncclComm_t comm = NULL;
  ncclResult_t rc = ncclCommInitRank(&comm, n, id, r);
  const char *text = ncclGetLastError(NULL);
  const char *want = r == 1 ? "different encryption key" : "rank(s) [1]";
  if (rc == ncclSuccess || strstr(text, want) == NULL) {
    fprintf(stderr, "rank %d: expected a failed init naming '%s', got %d \"%s\"\n", r, want,
            (int)rc, text);
    EXPECT(0);
  } else {
    printf("rank %d refused as expected: %s\n", r, text);
  }
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s threads|processes|emu|emu-processes|wrong-key\n", argv[0]);
    return 2;
  }
  const char *m = argv[1];
  setenv("NCCL_SHM_DISABLE", "1", 1);
  int on_device = strncmp(m, "emu", 3) == 0;
  if (strcmp(m, "threads") == 0 || strcmp(m, "emu") == 0) {
    use_key(KEY);
    for (int n = 2; n <= 4; n += 2) on_threads(n, on_device);
  } else if (strcmp(m, "processes") == 0 || strcmp(m, "emu-processes") == 0) {
    for (int n = 2; n <= 4; n += 2) fork_ranks(n, keyed_setup, process_rank, &on_device);
  } else if (strcmp(m, "wrong-key") == 0) {
    fork_ranks(2, wrong_key_setup, wrong_key_rank, NULL);
  } else {
    fprintf(stderr, "unknown mode %s\n", m);
    return 2;
  }
  if (failures) {
    fprintf(stderr, "encryption %s: %d failure(s)\n", m, failures);
    return 1;
  }
  printf("encryption %s: ok\n", m);
  return 0;
}
