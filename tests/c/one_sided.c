/* One-sided calls through the C ABI: windows registered collectively,
   ncclPutSignal / ncclSignal / ncclWaitSignal in a ring and to every peer
   in a group, many rounds without resetting counts, the data checked, and
   every misuse answered with its code and its ncclGetLastError text.

   one_sided threads N     N ranks of one process (ncclCommInitAll; the
                           windows registered by one thread in a group;
                           NCCL_NUM_RMA_SIG=2 from the environment)
   one_sided rank R N      rank R of N processes (rank 0 writes the unique
                           id to the file ONE_SIDED_ID; numRmaSig=2 by
                           ncclConfig_t)
   one_sided rank R N H    the same, rank R on host R % H (NCCL_HOSTID):
                           puts to another host travel as messages
   one_sided dies R N      2 processes: rank 1 exits after registering, and
                           rank 0's wait ends naming it
   one_sided emu N         N ranks of one process on the emulated GPU
                           (RCCL_DEVICE=emu): windows of device memory,
                           every call on the rank's stream, the data
                           copied back and checked
   one_sided emu R N       rank R of N processes on the emulated GPU: the
                           same on ncclMemAlloc's device memory, which
                           the other processes map; device memory not
                           from ncclMemAlloc refused, naming it */
#define _POSIX_C_SOURCE 200809L
#include <nccl.h>
#include <rcclrs_emu.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "ranks.h"

#define ROUNDS 200
#define COUNT 1000 /* floats per put */
#define PAGE 4096
#define MAXR 8

/* `call` returns `code` and comm's last error contains `text`. */
static void expect_error(ncclResult_t rc, ncclResult_t code, ncclComm_t comm, const char *text,
                         int line) {
  const char *last = ncclGetLastError(comm);
  if (rc != code || strstr(last, text) == NULL) {
    fprintf(stderr, "line %d: got %d \"%s\", expected %d with \"%s\"\n", line, (int)rc, last,
            (int)code, text);
    __sync_fetch_and_add(&failures, 1);
  }
}
#define EXPECT_ERROR(call, code, comm, text) expect_error((call), (code), (comm), (text), __LINE__)

static float value(int rank, int round, int i) { return (float)(rank * 100000 + round * 1000 + i % 997); }

static size_t window_bytes(int rank) { return 2 * COUNT * sizeof(float) + (size_t)rank * PAGE; }

struct rank_ctx {
  ncclComm_t comm;
  int rank, n;
  float *buf;
  ncclWindow_t win;
};

static ncclWaitSignalDesc_t desc(int peer, int sig) {
  ncclWaitSignalDesc_t d = {1, peer, sig, 0};
  return d;
}

/* Rounds of a ring: put into the next rank's window, wait for the
   previous rank's data and check it, acknowledge it, wait for the next
   rank's acknowledgement. Then rounds of puts to every peer in a group
   and one wait for all. */
static void exchange(struct rank_ctx *x) {
  int rank = x->rank, n = x->n, next = (rank + 1) % n, prev = (rank + n - 1) % n;
  float *src = malloc(COUNT * sizeof(float));
  for (int round = 0; round < ROUNDS; round++) {
    size_t offset = (size_t)(round % 2) * COUNT * sizeof(float);
    for (int i = 0; i < COUNT; i++) src[i] = value(rank, round, i);
    CHECK(ncclPutSignal(src, COUNT, ncclFloat, next, x->win, offset, 0, 0, 0, x->comm, NULL));
    ncclWaitSignalDesc_t data = desc(prev, 0), ack = desc(next, 1);
    CHECK(ncclWaitSignal(1, &data, x->comm, NULL));
    float *got = x->buf + (round % 2) * COUNT;
    for (int i = 0; i < COUNT; i++) {
      if (got[i] != value(prev, round, i)) {
        fprintf(stderr, "rank %d round %d: [%d] = %g from rank %d\n", rank, round, i, got[i], prev);
        exit(1);
      }
    }
    CHECK(ncclSignal(prev, 1, 0, 0, x->comm, NULL));
    CHECK(ncclWaitSignal(1, &ack, x->comm, NULL));
  }
  /* A group that waits before it puts: the wait runs at the group's end. */
  for (int round = 0; round < ROUNDS / 10; round++) {
    size_t offset = (size_t)(round % 2) * COUNT * sizeof(float);
    for (int i = 0; i < COUNT; i++) src[i] = value(rank, round + 7, i);
    ncclWaitSignalDesc_t data = desc(prev, 0), ack = desc(next, 1);
    CHECK(ncclGroupStart());
    CHECK(ncclWaitSignal(1, &data, x->comm, NULL));
    CHECK(ncclPutSignal(src, COUNT, ncclFloat, next, x->win, offset, 0, 0, 0, x->comm, NULL));
    CHECK(ncclGroupEnd());
    EXPECT(x->buf[(round % 2) * COUNT + 5] == value(prev, round + 7, 5));
    CHECK(ncclSignal(prev, 1, 0, 0, x->comm, NULL));
    CHECK(ncclWaitSignal(1, &ack, x->comm, NULL));
  }
  for (int round = 0; round < ROUNDS / 4; round++) {
    ncclWaitSignalDesc_t waits[MAXR], acks[MAXR];
    int k = 0;
    src[0] = value(rank, round, 0);
    CHECK(ncclGroupStart());
    for (int peer = 0; peer < n; peer++) {
      if (peer == rank) continue;
      CHECK(ncclPutSignal(src, 1, ncclFloat, peer, x->win, rank * sizeof(float), 0, 0, 0, x->comm, NULL));
      waits[k] = desc(peer, 0);
      acks[k++] = desc(peer, 1);
    }
    CHECK(ncclGroupEnd());
    CHECK(ncclWaitSignal(k, waits, x->comm, NULL));
    for (int peer = 0; peer < n; peer++)
      if (peer != rank) EXPECT(x->buf[peer] == value(peer, round, 0));
    for (int peer = 0; peer < n; peer++)
      if (peer != rank) CHECK(ncclSignal(peer, 1, 0, 0, x->comm, NULL));
    CHECK(ncclWaitSignal(k, acks, x->comm, NULL));
  }
  free(src);
}

/* Every misuse, with its code and text. */
static void misuse(struct rank_ctx *x) {
  ncclComm_t c = x->comm;
  int rank = x->rank, n = x->n, peer = (rank + 1) % n;
  char text[256];
  float two[2] = {0, 0};
  size_t end = window_bytes(peer);
  snprintf(text, sizeof text, "8 bytes at offset %zu run past the end of window #0 of rank %d (%zu bytes)",
           end - 4, peer, end);
  EXPECT_ERROR(ncclPutSignal(two, 2, ncclFloat, peer, x->win, end - 4, 0, 0, 0, c, NULL),
               ncclInvalidArgument, c, text);
  EXPECT_ERROR(ncclSignal(peer, 2, 0, 0, c, NULL), ncclInvalidArgument, c, "sigIdx 2 is outside 0..2");
  EXPECT_ERROR(ncclSignal(peer, 0, 1, 0, c, NULL), ncclInvalidArgument, c, "ctx 1 is outside 0..1");
  EXPECT_ERROR(ncclSignal(peer, 0, 0, 1, c, NULL), ncclInvalidArgument, c, "flags 0x1: must be 0");
  snprintf(text, sizeof text, "peer %d is outside 0..%d", n, n);
  EXPECT_ERROR(ncclSignal(n, 0, 0, 0, c, NULL), ncclInvalidArgument, c, text);
  ncclWaitSignalDesc_t none = {0, peer, 0, 0};
  EXPECT_ERROR(ncclWaitSignal(0, &none, c, NULL), ncclInvalidArgument, c, "nDesc 0 is not positive");
  EXPECT_ERROR(ncclWaitSignal(1, &none, c, NULL), ncclInvalidArgument, c,
               "signalDescs[0].opCnt 0 is not positive");
  EXPECT_ERROR(ncclPutSignal(two, 1, ncclFloat, peer, (ncclWindow_t)(uintptr_t)0x7fffffffff, 0, 0, 0, 0, c, NULL),
               ncclInvalidArgument, c, "is not a window of this communicator");
  EXPECT_ERROR(ncclMemFree(x->buf), ncclInvalidUsage, NULL, "still in 1 registered window(s)");
  void *user = NULL;
  CHECK(ncclWinGetUserPtr(c, x->win, &user));
  EXPECT(user == x->buf);
  /* The last rank's buffer is misaligned: every rank fails, naming it. */
  ncclWindow_t bad;
  char *base = (char *)x->buf + (rank == n - 1 ? 8 : 0);
  snprintf(text, sizeof text, "window #1 of rank %d", n - 1);
  EXPECT_ERROR(ncclCommWindowRegister(c, base, PAGE, &bad, NCCL_WIN_DEFAULT), ncclInvalidArgument, c, text);
  EXPECT(strstr(ncclGetLastError(c), "8 bytes past a multiple of NCCL_WIN_REQUIRED_ALIGNMENT (4096 bytes)"));
}

static void *run_rank(void *p) {
  struct rank_ctx *x = p;
  exchange(x);
  misuse(x);
  return NULL;
}

static void finish(struct rank_ctx *x) {
  CHECK(ncclMemFree(x->buf));
  CHECK(ncclCommDestroy(x->comm));
}

static int threads(int n) {
  struct rank_ctx ctx[MAXR];
  ncclComm_t comms[MAXR];
  int devs[MAXR] = {0, 1, 2, 3, 4, 5, 6, 7};
  CHECK(ncclCommInitAll(comms, n, devs));
  /* Signals come with the first window. */
  EXPECT_ERROR(ncclSignal(1, 0, 0, 0, comms[0], NULL), ncclInvalidUsage, comms[0], "no window was registered");
  CHECK(ncclGroupStart());
  for (int r = 0; r < n; r++) {
    ctx[r].comm = comms[r];
    ctx[r].rank = r;
    ctx[r].n = n;
    CHECK(ncclMemAlloc((void **)&ctx[r].buf, window_bytes(r)));
    CHECK(ncclCommWindowRegister(comms[r], ctx[r].buf, window_bytes(r), &ctx[r].win, NCCL_WIN_STRICT_ORDERING));
  }
  CHECK(ncclGroupEnd());
  pthread_t th[MAXR];
  for (int r = 0; r < n; r++) pthread_create(&th[r], NULL, run_rank, &ctx[r]);
  for (int r = 0; r < n; r++) pthread_join(th[r], NULL);
  ncclWindow_t wins[MAXR] = {0};
  for (int r = 0; r < n; r++) wins[r] = ctx[r].win;
  CHECK(ncclGroupStart());
  for (int r = 0; r < n; r++) CHECK(ncclCommWindowDeregister(comms[r], wins[r]));
  CHECK(ncclGroupEnd());
  EXPECT_ERROR(ncclCommWindowDeregister(comms[0], wins[0]), ncclInvalidArgument, comms[0],
               "is not a window of this communicator");
  for (int r = 0; r < n; r++) finish(&ctx[r]);
  return 0;
}

/* The ring of exchange() on device memory: puts, signals and waits are
   enqueued on the rank's stream; the host syncs it to check the data. */
static void *device_ring(void *p) {
  struct rank_ctx *x = p;
  int rank = x->rank, n = x->n, next = (rank + 1) % n, prev = (rank + n - 1) % n;
  size_t bytes = COUNT * sizeof(float);
  float *host = malloc(bytes), *src;
  cudaStream_t stream;
  CHECK(rcclrsEmuStreamCreate(&stream));
  CHECK(ncclMemAlloc((void **)&src, bytes));
  for (int round = 0; round < ROUNDS; round++) {
    size_t offset = (size_t)(round % 2) * bytes;
    for (int i = 0; i < COUNT; i++) host[i] = value(rank, round, i);
    CHECK(rcclrsEmuMemcpyAsync(src, host, bytes, stream));
    CHECK(ncclPutSignal(src, COUNT, ncclFloat, next, x->win, offset, 0, 0, 0, x->comm, stream));
    ncclWaitSignalDesc_t data = desc(prev, 0), ack = desc(next, 1);
    CHECK(ncclWaitSignal(1, &data, x->comm, stream));
    CHECK(rcclrsEmuStreamSynchronize(stream));
    CHECK(rcclrsEmuMemcpy(host, x->buf + (round % 2) * COUNT, bytes));
    for (int i = 0; i < COUNT; i++) {
      if (host[i] != value(prev, round, i)) {
        fprintf(stderr, "rank %d round %d: [%d] = %g from rank %d\n", rank, round, i, host[i], prev);
        exit(1);
      }
    }
    CHECK(ncclSignal(prev, 1, 0, 0, x->comm, stream));
    CHECK(ncclWaitSignal(1, &ack, x->comm, stream));
  }
  /* A group that waits before it puts: the wait is enqueued at its end. */
  for (int round = 0; round < ROUNDS / 10; round++) {
    ncclWaitSignalDesc_t data = desc(prev, 0), ack = desc(next, 1);
    for (int i = 0; i < COUNT; i++) host[i] = value(rank, round + 7, i);
    CHECK(rcclrsEmuMemcpyAsync(src, host, bytes, stream));
    CHECK(ncclGroupStart());
    CHECK(ncclWaitSignal(1, &data, x->comm, stream));
    CHECK(ncclPutSignal(src, COUNT, ncclFloat, next, x->win, 0, 0, 0, 0, x->comm, stream));
    CHECK(ncclGroupEnd());
    CHECK(rcclrsEmuStreamSynchronize(stream));
    CHECK(rcclrsEmuMemcpy(host, x->buf, bytes));
    EXPECT(host[5] == value(prev, round + 7, 5));
    CHECK(ncclSignal(prev, 1, 0, 0, x->comm, stream));
    CHECK(ncclWaitSignal(1, &ack, x->comm, stream));
  }
  CHECK(rcclrsEmuStreamSynchronize(stream));
  ncclResult_t async = ncclSuccess;
  CHECK(ncclCommGetAsyncError(x->comm, &async));
  EXPECT(async == ncclSuccess);
  CHECK(rcclrsEmuStreamDestroy(stream));
  CHECK(ncclMemFree(src));
  free(host);
  return NULL;
}

static int emu(int n) {
  struct rank_ctx ctx[MAXR];
  ncclComm_t comms[MAXR];
  int devs[MAXR] = {0, 1, 2, 3, 4, 5, 6, 7};
  CHECK(ncclCommInitAll(comms, n, devs));
  CHECK(ncclGroupStart());
  for (int r = 0; r < n; r++) {
    ctx[r] = (struct rank_ctx){comms[r], r, n, NULL, NULL};
    CHECK(ncclMemAlloc((void **)&ctx[r].buf, window_bytes(r)));
    CHECK(ncclCommWindowRegister(comms[r], ctx[r].buf, window_bytes(r), &ctx[r].win, NCCL_WIN_DEFAULT));
  }
  CHECK(ncclGroupEnd());
  pthread_t th[MAXR];
  for (int r = 0; r < n; r++) pthread_create(&th[r], NULL, device_ring, &ctx[r]);
  for (int r = 0; r < n; r++) pthread_join(th[r], NULL);
  CHECK(ncclGroupStart());
  for (int r = 0; r < n; r++) CHECK(ncclCommWindowDeregister(comms[r], ctx[r].win));
  CHECK(ncclGroupEnd());
  for (int r = 0; r < n; r++) finish(&ctx[r]);
  return 0;
}

static ncclComm_t join(int rank, int n);

static int emu_process(int rank, int n) {
  struct rank_ctx x = {join(rank, n), rank, n, NULL, NULL};
  CHECK(ncclMemAlloc((void **)&x.buf, window_bytes(rank)));
  CHECK(ncclCommWindowRegister(x.comm, x.buf, window_bytes(rank), &x.win, NCCL_WIN_DEFAULT));
  device_ring(&x);
  CHECK(ncclCommWindowDeregister(x.comm, x.win));
  void *plain;
  ncclWindow_t bad;
  CHECK(rcclrsEmuMalloc(&plain, PAGE));
  EXPECT_ERROR(ncclCommWindowRegister(x.comm, plain, PAGE, &bad, NCCL_WIN_DEFAULT), ncclInvalidUsage,
               x.comm, "window #1 of rank 1 (0x");
  EXPECT(strstr(ncclGetLastError(x.comm), "4096 bytes) is not memory from ncclMemAlloc"));
  CHECK(rcclrsEmuFree(plain));
  finish(&x);
  return 0;
}

static ncclComm_t join(int rank, int n) {
  ncclComm_t comm;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.numRmaSig = 2;
  ncclUniqueId id = id_through_file(rank, "ONE_SIDED_ID");
  CHECK(ncclCommInitRankConfig(&comm, n, id, rank, &config));
  return comm;
}

static int process(int rank, int n) {
  struct rank_ctx x = {join(rank, n), rank, n, NULL, NULL};
  EXPECT_ERROR(ncclSignal((rank + 1) % n, 0, 0, 0, x.comm, NULL), ncclInvalidUsage, x.comm,
               "no window was registered");
  CHECK(ncclMemAlloc((void **)&x.buf, window_bytes(rank)));
  CHECK(ncclCommWindowRegister(x.comm, x.buf, window_bytes(rank), &x.win, NCCL_WIN_DEFAULT));
  run_rank(&x);
  CHECK(ncclCommWindowDeregister(x.comm, x.win));
  finish(&x);
  return 0;
}

static int dies(int rank) {
  struct rank_ctx x = {join(rank, 2), rank, 2, NULL, NULL};
  CHECK(ncclMemAlloc((void **)&x.buf, PAGE));
  CHECK(ncclCommWindowRegister(x.comm, x.buf, PAGE, &x.win, NCCL_WIN_DEFAULT));
  if (rank == 1) {
    printf("ok\n");
    fflush(stdout);
    _exit(0);
  }
  ncclWaitSignalDesc_t d = desc(1, 0);
  EXPECT_ERROR(ncclWaitSignal(1, &d, x.comm, NULL), ncclRemoteError, x.comm, "from rank 1 (host");
  return 0;
}

int main(int argc, char **argv) {
  int code = 2;
  if (argc == 3 && strcmp(argv[1], "threads") == 0) code = threads(atoi(argv[2]));
  if (argc == 5 && strcmp(argv[1], "rank") == 0) {
    char host[32];
    snprintf(host, sizeof host, "host%d", atoi(argv[2]) % atoi(argv[4]));
    setenv("NCCL_HOSTID", host, 1);
  }
  if ((argc == 4 || argc == 5) && strcmp(argv[1], "rank") == 0) code = process(atoi(argv[2]), atoi(argv[3]));
  if (argc == 4 && strcmp(argv[1], "dies") == 0) code = dies(atoi(argv[2]));
  if (argc == 3 && strcmp(argv[1], "emu") == 0) code = emu(atoi(argv[2]));
  if (argc == 4 && strcmp(argv[1], "emu") == 0) code = emu_process(atoi(argv[2]), atoi(argv[3]));
  if (code == 2) {
    fprintf(stderr, "usage: one_sided threads N | rank R N [H] | dies R N | emu N | emu R N\n");
    return 2;
  }
  if (failures) fprintf(stderr, "%d failure(s)\n", failures);
  else printf("ok\n");
  return failures ? 1 : 0;
}
