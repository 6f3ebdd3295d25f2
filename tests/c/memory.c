/*
 * ncclCommMemStats, ncclCommSuspend and ncclCommResume from C: every rank
 * runs an all-reduce sweep, reads the four statistics, suspends (every
 * rank: it is collective), sees its calls refused, resumes and runs the
 * sweep again, checking every result; and the misuses' errors with their
 * texts (ncclGetLastError).
 *
 *   memory threads    ranks as threads of this process, host memory
 *   memory processes  ranks as processes, host memory
 *   memory emu        ranks as threads, on the emulated GPU
 *
 * each with 2 ranks, then 4.
 *
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
#include <unistd.h>

#include "check.h"
#include "ranks.h"

#define MAX_RANKS 4
#define MAX_COUNT 65536

/* `call` fails with `code` and the communicator's last error reads `text`. */
static void expect_error(ncclComm_t comm, ncclResult_t rc, ncclResult_t code, const char *text) {
  const char *got = ncclGetLastError(comm);
  if (rc != code || strcmp(got, text) != 0) {
    fprintf(stderr, "expected %d \"%s\"\n     got %d \"%s\"\n", (int)code, text, (int)rc, got);
    exit(1);
  }
}

struct rank {
  ncclComm_t comm;
  int rank, nranks, on_device;
};

/* This process's resident set in bytes (/proc/self/statm). */
static unsigned long long rss(void) {
  unsigned long long size = 0, resident = 0;
  FILE *f = fopen("/proc/self/statm", "r");
  if (!f || fscanf(f, "%llu %llu", &size, &resident) != 2) abort();
  fclose(f);
  return resident * (unsigned long long)sysconf(_SC_PAGESIZE);
}

static uint64_t stat(ncclComm_t comm, ncclCommMemStat_t which) {
  uint64_t value = 0;
  CHECK(ncclCommMemStats(comm, which, &value));
  return value;
}

/* One all-reduce of `count` floats, rank r giving r + 1; checks the sum. */
static ncclResult_t all_reduce(const struct rank *x, size_t count, int check) {
  size_t bytes = count * sizeof(float);
  float *host = malloc(bytes);
  float *send, *recv;
  cudaStream_t stream = NULL;
  for (size_t i = 0; i < count; i++) host[i] = (float)(x->rank + 1);
  if (x->on_device) {
    CHECK(ncclMemAlloc((void **)&send, bytes));
    CHECK(ncclMemAlloc((void **)&recv, bytes));
    CHECK(rcclrsEmuStreamCreate(&stream));
    CHECK(rcclrsEmuMemcpy(send, host, bytes));
  } else {
    send = malloc(bytes);
    recv = malloc(bytes);
    memcpy(send, host, bytes);
  }
  ncclResult_t rc = ncclAllReduce(send, recv, count, ncclFloat, ncclSum, x->comm, stream);
  if (rc == ncclSuccess && check) {
    float *out = recv;
    if (x->on_device) {
      CHECK(rcclrsEmuStreamSynchronize(stream));
      CHECK(rcclrsEmuMemcpy(host, recv, bytes));
      out = host;
    }
    float want = (float)(x->nranks * (x->nranks + 1) / 2);
    for (size_t i = 0; i < count; i++) EXPECT(out[i] == want);
  }
  if (x->on_device) {
    CHECK(rcclrsEmuStreamDestroy(stream));
    CHECK(ncclMemFree(send));
    CHECK(ncclMemFree(recv));
  } else {
    free(send);
    free(recv);
  }
  free(host);
  return rc;
}

static void sweep(const struct rank *x) {
  static const size_t counts[] = {64, 4096, MAX_COUNT};
  for (int i = 0; i < 3; i++) CHECK(all_reduce(x, counts[i], 1));
}

static void *run_rank(void *arg) {
  struct rank *x = arg;
  ncclComm_t comm = x->comm;
  char text[512];
  sweep(x);
  uint64_t total = stat(comm, ncclStatGpuMemTotal);
  EXPECT(total > 0);
  EXPECT(stat(comm, ncclStatGpuMemSuspend) == total);
  EXPECT(stat(comm, ncclStatGpuMemPersist) == 0);
  EXPECT(stat(comm, ncclStatGpuMemSuspended) == 0);

  uint64_t value;
  expect_error(comm, ncclCommMemStats(comm, (ncclCommMemStat_t)4, &value), ncclInvalidArgument,
               "ncclCommMemStats: invalid argument: unknown ncclCommMemStat_t 4");
  expect_error(comm, ncclCommSuspend(comm, 0x6), ncclInvalidArgument,
               "ncclCommSuspend: invalid argument: unknown suspend flags 0x6");
  snprintf(text, sizeof text,
           "ncclCommResume: invalid usage: rank %d: ncclCommResume: the communicator is not "
           "suspended",
           x->rank);
  expect_error(comm, ncclCommResume(comm), ncclInvalidUsage, text);

  unsigned long long rss_held = rss();
  CHECK(ncclCommSuspend(comm, NCCL_SUSPEND_MEM));
  unsigned long long rss_suspended = rss();
  EXPECT(stat(comm, ncclStatGpuMemSuspended) == 1);
  EXPECT(stat(comm, ncclStatGpuMemSuspend) == 0);
  EXPECT(stat(comm, ncclStatGpuMemTotal) == 0);
  snprintf(text, sizeof text,
           "ncclAllReduce: invalid usage: rank %d: the communicator is suspended "
           "(ncclCommSuspend); call ncclCommResume before any other operation",
           x->rank);
  expect_error(comm, all_reduce(x, 64, 0), ncclInvalidUsage, text);
  CHECK(ncclCommResume(comm));
  EXPECT(stat(comm, ncclStatGpuMemSuspended) == 0);
  sweep(x);
  EXPECT(stat(comm, ncclStatGpuMemTotal) == total);
  printf("rank %d of %d: %llu bytes held, released by the suspend, held again after the resume; "
         "process rss %llu -> %llu bytes on suspend\n",
         x->rank, x->nranks, (unsigned long long)total, rss_held, rss_suspended);
  fflush(stdout);
  return NULL;
}

static void on_threads(int n, int on_device) {
  ncclComm_t comms[MAX_RANKS];
  struct rank ranks[MAX_RANKS];
  pthread_t th[MAX_RANKS];
  CHECK(ncclCommInitAll(comms, n, NULL));
  for (int r = 0; r < n; r++) {
    ranks[r] = (struct rank){comms[r], r, n, on_device};
    pthread_create(&th[r], NULL, run_rank, &ranks[r]);
  }
  for (int r = 0; r < n; r++) pthread_join(th[r], NULL);
  for (int r = 0; r < n; r++) CHECK(ncclCommDestroy(comms[r]));
}

static void process_rank(int r, int n, ncclUniqueId id, void *unused) {
  (void)unused;
  struct rank x = {NULL, r, n, 0};
  CHECK(ncclCommInitRank(&x.comm, n, id, r));
  run_rank(&x);
  CHECK(ncclCommDestroy(x.comm));
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s threads|processes|emu\n", argv[0]);
    return 2;
  }
  for (int n = 2; n <= 4; n += 2) {
    if (strcmp(argv[1], "threads") == 0) {
      on_threads(n, 0);
    } else if (strcmp(argv[1], "emu") == 0) {
      on_threads(n, 1);
    } else if (strcmp(argv[1], "processes") == 0) {
      fork_ranks(n, NULL, process_rank, NULL);
    } else {
      fprintf(stderr, "unknown mode %s\n", argv[1]);
      return 2;
    }
  }
  if (failures) {
    fprintf(stderr, "memory %s: %d failure(s)\n", argv[1], failures);
    return 1;
  }
  printf("memory %s: ok\n", argv[1]);
  return 0;
}
