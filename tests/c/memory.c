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
 *   memory emu-processes  ranks as processes, on the emulated GPU
 *
 * each with 2 ranks, then 4, then 2 under NCCL_MAX_MEM_BYTES, whose first
 * allocation is refused.
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

/* The limit of the capped runs: below any connection's FIFOs. */
#define CAP "10000"

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
           "ncclCommResume: invalid usage: rank %d: the communicator is not "
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

/* `text` starts with `prefix` and ends with `suffix`. */
static int framed(const char *text, const char *prefix, const char *suffix) {
  size_t len = strlen(text), tail = strlen(suffix);
  return strncmp(text, prefix, strlen(prefix)) == 0 && len > tail &&
         strcmp(text + len - tail, suffix) == 0;
}

/* Under NCCL_MAX_MEM_BYTES=CAP the first all-reduce fails: on a rank
 * whose allocation was refused with the refusal, naming the rank, what is
 * held and the limit; on a rank that a peer's refusal stopped first with a
 * remote error quoting it. The communicator holds no more than the cap. */
static void *run_capped_rank(void *arg) {
  struct rank *x = arg;
  char own[64], remote[64];
  snprintf(own, sizeof own, "ncclAllReduce: system error: rank %d: ", x->rank);
  snprintf(remote, sizeof remote, "ncclAllReduce: remote error: rank %d: ", x->rank);
  const char *limit = " refused: the communicator holds ";
  const char *cap = " bytes and NCCL_MAX_MEM_BYTES allows " CAP;
  ncclResult_t rc = all_reduce(x, MAX_COUNT, 0);
  const char *got = ncclGetLastError(x->comm);
  int refused = rc == ncclSystemError && framed(got, own, cap) && strstr(got, limit);
  int told = rc == ncclRemoteError && framed(got, remote, cap) && strstr(got, limit);
  if (!refused && !told) {
    fprintf(stderr, "rank %d under the cap: got %d \"%s\"\n", x->rank, (int)rc, got);
    EXPECT(0);
  } else if (refused) {
    printf("under NCCL_MAX_MEM_BYTES=%s: %s\n", CAP, got);
  }
  EXPECT(stat(x->comm, ncclStatGpuMemTotal) <= (uint64_t)atoi(CAP));
  return NULL;
}

static void on_threads(int n, int on_device, int capped) {
  ncclComm_t comms[MAX_RANKS];
  struct rank ranks[MAX_RANKS];
  pthread_t th[MAX_RANKS];
  if (capped) setenv("NCCL_MAX_MEM_BYTES", CAP, 1);
  CHECK(ncclCommInitAll(comms, n, NULL));
  unsetenv("NCCL_MAX_MEM_BYTES");
  for (int r = 0; r < n; r++) {
    ranks[r] = (struct rank){comms[r], r, n, on_device};
    pthread_create(&th[r], NULL, capped ? run_capped_rank : run_rank, &ranks[r]);
  }
  for (int r = 0; r < n; r++) pthread_join(th[r], NULL);
  for (int r = 0; r < n; r++) CHECK(ncclCommDestroy(comms[r]));
}

struct mode {
  int on_device, capped;
};

static void process_setup(int r, void *arg) {
  (void)r;
  if (((struct mode *)arg)->capped) setenv("NCCL_MAX_MEM_BYTES", CAP, 1);
}

static void process_rank(int r, int n, ncclUniqueId id, void *arg) {
  const struct mode *mode = arg;
  struct rank x = {NULL, r, n, mode->on_device};
  CHECK(ncclCommInitRank(&x.comm, n, id, r));
  (mode->capped ? run_capped_rank : run_rank)(&x);
  CHECK(ncclCommDestroy(x.comm));
}

/* 2 and 4 ranks, then 2 under the cap. */
static void run_mode(int processes, int on_device) {
  for (int n = 2; n <= 6; n += 2) {
    struct mode mode = {on_device, n == 6};
    int ranks = mode.capped ? 2 : n;
    if (processes)
      fork_ranks(ranks, process_setup, process_rank, &mode);
    else
      on_threads(ranks, on_device, mode.capped);
  }
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s threads|processes|emu|emu-processes\n", argv[0]);
    return 2;
  }
  const char *m = argv[1];
  if (strcmp(m, "threads") == 0) {
    run_mode(0, 0);
  } else if (strcmp(m, "emu") == 0) {
    run_mode(0, 1);
  } else if (strcmp(m, "processes") == 0) {
    run_mode(1, 0);
  } else if (strcmp(m, "emu-processes") == 0) {
    run_mode(1, 1);
  } else {
    fprintf(stderr, "unknown mode %s\n", m);
    return 2;
  }
  if (failures) {
    fprintf(stderr, "memory %s: %d failure(s)\n", argv[1], failures);
    return 1;
  }
  printf("memory %s: ok\n", argv[1]);
  return 0;
}
