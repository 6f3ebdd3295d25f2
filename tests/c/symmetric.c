/* Collectives on symmetric windows through the C ABI: buffers from
   ncclMemAlloc registered with NCCL_WIN_COLL_SYMMETRIC, then ncclAllReduce,
   ncclReduceScatter and ncclAllGather on them, out of place and in place,
   for ten datatypes, every reduction op, counts of 1, odd and thousands of
   elements (all-reduces one shot and two shots), call after call. Values
   are small, so every result is exact: each is compared bitwise with a
   reference computed here, which also makes it the same on every rank.
   Then the misuses, with their ncclGetLastError texts: a symmetric window
   of different sizes, and buffers at different offsets of the window.

   symmetric threads N [staged]   N ranks as threads of one process
   symmetric rank R N [staged]    rank R of N processes (rank 0 writes the
                                  unique id to the file SYMMETRIC_ID)
   symmetric emu N                N threads on the emulated GPU
                                  (RCCL_DEVICE=emu): windows of device
                                  memory, calls on streams, staged
   symmetric emu R N              rank R of N processes on the emulated
                                  GPU (device windows between processes)

   Host runs set NCCL_ALGO=^oneshot, so that every call runs on the
   windows (small all-reduces would stay on the board), or with `staged`
   NCCL_ALGO=^symmetric. Each rank prints how many of its calls must have
   run on the windows and a digest of its results: with NCCL_DEBUG=INFO
   NCCL_DEBUG_SUBSYS=TUNING the caller counts the tuner's lines ending
   "-> symmetric one-shot|two-shot on windows" against it, and compares
   the digests of staged and symmetric runs. */
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

#define MAXR 4
#define PAGE 4096
#define ROUNDS 5 /* one per reduction op */
/* The largest count, in elements per rank: 36 KB of floats, past the
   32 KiB from which an all-reduce takes two shots. */
#define MAXC 9001
/* The window: a send region, then a receive region. */
#define REGION (((MAXR * MAXC * 8) / PAGE + 1) * PAGE)

static const size_t counts[] = {1, 1001, 3001, MAXC};
#define NCOUNTS (sizeof counts / sizeof counts[0])
static const ncclRedOp_t ops[ROUNDS] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg};

struct type {
  ncclDataType_t t;
  size_t size;
  int is_float, is_unsigned;
};
static const struct type types[] = {
    {ncclInt8, 1, 0, 0},    {ncclUint8, 1, 0, 1},    {ncclInt32, 4, 0, 0},   {ncclUint32, 4, 0, 1},
    {ncclInt64, 8, 0, 0},   {ncclUint64, 8, 0, 1},   {ncclFloat16, 2, 1, 0}, {ncclFloat32, 4, 1, 0},
    {ncclFloat64, 8, 1, 0}, {ncclBfloat16, 2, 1, 0},
};
#define NTYPES (sizeof types / sizeof types[0])

enum coll { ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER };
static const char *const coll_names[] = {"all-reduce", "reduce-scatter", "all-gather"};

struct rank_ctx {
  ncclComm_t comm;
  int rank, n, on_device, staged;
  char *win; /* send region, then receive region */
  ncclWindow_t window;
  cudaStream_t stream;
  unsigned char *in, *got, *want; /* host scratch, REGION bytes each */
  long long pids[MAXR];            /* every rank's process, for error texts */
  int calls;
  uint64_t digest;
};

/* Input element `i` of `rank` in `round`: a small value (floats in halves)
   whose sums, products and averages over 2 or 4 ranks are exact in every
   type; unsigned 8-bit products wrap, as C's do. */
static double value(const struct type *t, int rank, int round, size_t i) {
  static const double signed_values[5] = {-2, -1, 1, 2, 3};
  int k = (int)((i * 7 + (size_t)rank * 3 + (size_t)round) % 5);
  if (t->is_unsigned) return k + 1;
  return signed_values[k] * (t->is_float ? 0.5 : 1);
}

/* Stores exact `v` as element `i` of `buf` in type `t`. */
static void store(const struct type *t, unsigned char *buf, size_t i, double v) {
  void *at = buf + i * t->size;
  float f = (float)v;
  uint32_t bits;
  memcpy(&bits, &f, 4);
  switch (t->t) {
    case ncclInt8: *(int8_t *)at = (int8_t)(int64_t)v; break;
    case ncclUint8: *(uint8_t *)at = (uint8_t)(int64_t)v; break;
    case ncclInt32: *(int32_t *)at = (int32_t)(int64_t)v; break;
    case ncclUint32: *(uint32_t *)at = (uint32_t)(int64_t)v; break;
    case ncclInt64: *(int64_t *)at = (int64_t)v; break;
    case ncclUint64: *(uint64_t *)at = (uint64_t)(int64_t)v; break;
    case ncclFloat32: memcpy(at, &f, 4); break;
    case ncclFloat64: memcpy(at, &v, 8); break;
    case ncclBfloat16: { /* exact values: the high half of the float */
      uint16_t h = (uint16_t)(bits >> 16);
      memcpy(at, &h, 2);
      break;
    }
    case ncclFloat16: { /* exact, normal or zero */
      uint16_t h = (uint16_t)((bits >> 16) & 0x8000);
      if (f != 0) h |= (uint16_t)(((((bits >> 23) & 0xff) - 127 + 15) << 10) | ((bits >> 13) & 0x3ff));
      memcpy(at, &h, 2);
      break;
    }
    default: abort();
  }
}

/* `op` over every rank's element `i` in `round`, stored in `want`. */
static void reference(const struct rank_ctx *x, const struct type *t, ncclRedOp_t op, int round, size_t i,
                      size_t at) {
  double acc = value(t, 0, round, i);
  for (int r = 1; r < x->n; r++) {
    double v = value(t, r, round, i);
    if (op == ncclSum || op == ncclAvg) acc += v;
    if (op == ncclProd) acc *= v;
    if (op == ncclMax && v > acc) acc = v;
    if (op == ncclMin && v < acc) acc = v;
  }
  /* Integer averages truncate toward zero, as C's division. */
  if (op == ncclAvg) acc = t->is_float ? acc / x->n : (double)((int64_t)acc / x->n);
  store(t, x->want, at, acc);
}

static void to_window(struct rank_ctx *x, size_t offset, const void *src, size_t bytes) {
  if (x->on_device) CHECK(rcclrsEmuMemcpy(x->win + offset, src, bytes));
  else memcpy(x->win + offset, src, bytes);
}

static void from_window(struct rank_ctx *x, size_t offset, void *dst, size_t bytes) {
  if (x->on_device) CHECK(rcclrsEmuMemcpy(dst, x->win + offset, bytes));
  else memcpy(dst, x->win + offset, bytes);
}

static uint64_t fnv1a(uint64_t h, const unsigned char *p, size_t len) {
  for (size_t i = 0; i < len; i++) h = (h ^ p[i]) * 0x100000001b3ULL;
  return h;
}

/* One call of `coll` on the window, its result checked against the
   reference and added to the digest. */
static void one_call(struct rank_ctx *x, enum coll coll, int in_place, const struct type *t, size_t count,
                     int round) {
  int rank = x->rank, n = x->n;
  ncclRedOp_t op = ops[round];
  size_t bytes = count * t->size, block = (size_t)rank * bytes;
  /* Input offset and its element count, output offset and its count. */
  size_t in_at = 0, in_count = coll == REDUCE_SCATTER ? n * count : count, out_at = REGION;
  size_t out_count = coll == ALL_GATHER ? n * count : count;
  if (in_place) {
    in_at = REGION + (coll == ALL_GATHER ? block : 0);
    out_at = REGION + (coll == REDUCE_SCATTER ? block : 0);
  }
  /* Poison the output, then write the input (over it when in place). */
  memset(x->got, 0xa5, out_count * t->size);
  to_window(x, out_at, x->got, out_count * t->size);
  for (size_t i = 0; i < in_count; i++) store(t, x->in, i, value(t, rank, round, i));
  to_window(x, in_at, x->in, in_count * t->size);
  void *send = x->win + in_at, *recv = x->win + out_at;
  switch (coll) {
    case ALL_REDUCE: CHECK(ncclAllReduce(send, recv, count, t->t, op, x->comm, x->stream)); break;
    case REDUCE_SCATTER: CHECK(ncclReduceScatter(send, recv, count, t->t, op, x->comm, x->stream)); break;
    case ALL_GATHER: CHECK(ncclAllGather(send, recv, count, t->t, x->comm, x->stream)); break;
  }
  if (x->on_device) CHECK(rcclrsEmuStreamSynchronize(x->stream));
  x->calls++;
  from_window(x, out_at, x->got, out_count * t->size);
  for (size_t i = 0; i < out_count; i++) {
    if (coll == ALL_GATHER) store(t, x->want, i, value(t, (int)(i / count), round, i % count));
    else reference(x, t, op, round, coll == REDUCE_SCATTER ? (size_t)rank * count + i : i, i);
  }
  size_t len = out_count * t->size;
  if (memcmp(x->got, x->want, len) != 0) {
    size_t i = 0;
    while (memcmp(x->got + i * t->size, x->want + i * t->size, t->size) == 0) i++;
    fprintf(stderr, "rank %d of %d: %s%s of %zu elements of type %d, op %d, round %d: element %zu differs\n",
            rank, n, in_place ? "in-place " : "", coll_names[coll], count, (int)t->t, (int)op, round, i);
    __atomic_fetch_add(&failures, 1, __ATOMIC_RELAXED);
  }
  x->digest = fnv1a(x->digest, x->got, len);
}

/* Every collective, type, count and op, call after call. */
static void collectives(struct rank_ctx *x) {
  for (size_t t = 0; t < NTYPES; t++)
    for (size_t c = 0; c < NCOUNTS; c++)
      for (int round = 0; round < ROUNDS; round++)
        for (int coll = ALL_REDUCE; coll <= ALL_GATHER; coll++)
          for (int in_place = 0; in_place < 2; in_place++)
            one_call(x, (enum coll)coll, in_place, &types[t], counts[c], round);
}

/* `rc` is `code` and the last error reads `text` exactly. */
static void expect_error(ncclComm_t comm, ncclResult_t rc, ncclResult_t code, const char *text, int line) {
  const char *got = ncclGetLastError(comm);
  if (rc != code || strcmp(got, text) != 0) {
    fprintf(stderr, "line %d: expected %d \"%s\"\n     got %d \"%s\"\n", line, (int)code, text, (int)rc, got);
    __atomic_fetch_add(&failures, 1, __ATOMIC_RELAXED);
  }
}
#define EXPECT_ERROR(call, code, comm, text) expect_error((comm), (call), (code), (text), __LINE__)

/* A symmetric window must have one size on every rank: each rank's is a
   page larger than the previous one's, and every rank fails naming rank 1. */
static void sizes_differ(struct rank_ctx *x) {
  char text[512];
  void *buf;
  ncclWindow_t window;
  size_t bytes = (size_t)(x->rank + 1) * PAGE;
  CHECK(ncclMemAlloc(&buf, bytes));
  snprintf(text, sizeof text,
           "ncclCommWindowRegister: invalid usage: window #1 is NCCL_WIN_COLL_SYMMETRIC but rank 0 registers "
           "%d bytes and rank 1 %d bytes: a symmetric window has one size on every rank",
           PAGE, 2 * PAGE);
  EXPECT_ERROR(ncclCommWindowRegister(x->comm, buf, bytes, &window, NCCL_WIN_COLL_SYMMETRIC), ncclInvalidUsage,
               x->comm, text);
  CHECK(ncclMemFree(buf));
}

/* What rank k reports when it finds the first peer whose offset differs
   from its own (rank r's send buffer lies at offset 64 * r). */
static void offsets_text(const struct rank_ctx *x, int k, const char *host, char *text, size_t size) {
  int peer = k == 0 ? 1 : 0;
  snprintf(text, size,
           "invalid usage: AllReduce #%d on symmetric windows: this rank passes its send at offset %d of "
           "window #0, receive at offset %d of window #0, rank %d (host %s, pid %lld) passes its send at offset %d "
           "of window #0, receive at offset %d of window #0 (in place, less the rank's block): "
           "NCCL_WIN_COLL_SYMMETRIC asks every rank's buffers at the same offsets of the same windows",
           x->calls + 1, 64 * k, REGION, peer, host, x->pids[peer], 64 * peer, REGION);
}

/* Every rank fails the call before a byte is read: with its own finding,
   or, when a peer found it first and closed the board, with the peer's
   finding quoted; the communicator is left failed, so its next call
   returns the same error. */
static void offsets_differ(struct rank_ctx *x) {
  char host[256], text[1024], want[1400];
  if (gethostname(host, sizeof host) != 0) abort();
  ncclResult_t rc =
      ncclAllReduce(x->win + 64 * x->rank, x->win + REGION, 5, ncclFloat, ncclSum, x->comm, NULL);
  const char *got = ncclGetLastError(x->comm);
  int found = 0;
  for (int k = 0; k < x->n && !found; k++) {
    offsets_text(x, k, host, text, sizeof text);
    if (k == x->rank)
      snprintf(want, sizeof want, "ncclAllReduce: %s", text);
    else
      snprintf(want, sizeof want,
               "ncclAllReduce: invalid usage: AllReduce #%d on the board: rank %d (host %s, pid %lld) failed: %s",
               x->calls + 1, k, host, x->pids[k], text);
    found = rc == ncclInvalidUsage && strcmp(got, want) == 0;
  }
  if (!found) {
    offsets_text(x, x->rank, host, text, sizeof text);
    fprintf(stderr, "rank %d: expected %d \"ncclAllReduce: %s\" (or a peer's finding quoted)\n     got %d \"%s\"\n",
            x->rank, (int)ncclInvalidUsage, text, (int)rc, got);
    __atomic_fetch_add(&failures, 1, __ATOMIC_RELAXED);
    return;
  }
  snprintf(want, sizeof want, "ncclCommWindowDeregister: %s", got + strlen("ncclAllReduce: "));
  EXPECT_ERROR(ncclCommWindowDeregister(x->comm, x->window), ncclInvalidUsage, x->comm, want);
}

/* Whether this rank's calls run on the windows: host memory, not staged. */
static int on_windows(const struct rank_ctx *x) { return !x->on_device && !x->staged; }

static void *run_rank(void *p) {
  struct rank_ctx *x = p;
  x->digest = 0xcbf29ce484222325ULL;
  if (x->on_device) CHECK(rcclrsEmuStreamCreate(&x->stream));
  if (on_windows(x)) {
    long long pid = (long long)getpid();
    CHECK(ncclAllGather(&pid, x->pids, 1, ncclInt64, x->comm, NULL));
  }
  collectives(x);
  sizes_differ(x);
  /* The offsets may differ where calls are staged. */
  if (on_windows(x)) offsets_differ(x);
  if (x->on_device) CHECK(rcclrsEmuStreamDestroy(x->stream));
  printf("rank %d of %d: %d calls, %d on symmetric windows expected, digest %016llx\n", x->rank, x->n, x->calls,
         on_windows(x) ? x->calls + 1 : 0, (unsigned long long)x->digest);
  fflush(stdout);
  return NULL;
}

static void setup(struct rank_ctx *x, ncclComm_t comm, int rank, int n, int on_device, int staged) {
  *x = (struct rank_ctx){.comm = comm, .rank = rank, .n = n, .on_device = on_device, .staged = staged};
  x->in = malloc(REGION);
  x->got = malloc(REGION);
  x->want = malloc(REGION);
  CHECK(ncclMemAlloc((void **)&x->win, 2 * REGION));
}

/* Deregisters the window unless offsets_differ failed the communicator
   (destroying it then releases the window), destroys the communicator and
   frees the window's memory. */
static void *finish(void *p) {
  struct rank_ctx *x = p;
  if (!on_windows(x)) CHECK(ncclCommWindowDeregister(x->comm, x->window));
  CHECK(ncclCommDestroy(x->comm));
  CHECK(ncclMemFree(x->win));
  free(x->in);
  free(x->got);
  free(x->want);
  return NULL;
}

/* N ranks as threads; the windows registered by this thread in a group. */
static int threads(int n, int on_device, int staged) {
  struct rank_ctx ctx[MAXR];
  ncclComm_t comms[MAXR];
  pthread_t th[MAXR];
  CHECK(ncclCommInitAll(comms, n, NULL));
  CHECK(ncclGroupStart());
  for (int r = 0; r < n; r++) {
    setup(&ctx[r], comms[r], r, n, on_device, staged);
    CHECK(ncclCommWindowRegister(comms[r], ctx[r].win, 2 * REGION, &ctx[r].window, NCCL_WIN_COLL_SYMMETRIC));
  }
  CHECK(ncclGroupEnd());
  for (int r = 0; r < n; r++) pthread_create(&th[r], NULL, run_rank, &ctx[r]);
  for (int r = 0; r < n; r++) pthread_join(th[r], NULL);
  for (int r = 0; r < n; r++) pthread_create(&th[r], NULL, finish, &ctx[r]);
  for (int r = 0; r < n; r++) pthread_join(th[r], NULL);
  return 0;
}

static ncclComm_t join(int rank, int n) {
  ncclComm_t comm;
  ncclUniqueId id = id_through_file(rank, "SYMMETRIC_ID");
  CHECK(ncclCommInitRank(&comm, n, id, rank));
  return comm;
}

static int process(int rank, int n, int on_device, int staged) {
  struct rank_ctx x;
  setup(&x, join(rank, n), rank, n, on_device, staged);
  CHECK(ncclCommWindowRegister(x.comm, x.win, 2 * REGION, &x.window, NCCL_WIN_COLL_SYMMETRIC));
  run_rank(&x);
  finish(&x);
  return 0;
}

int main(int argc, char **argv) {
  int code = 2, last = argc - 1, staged = argc > 2 && strcmp(argv[last], "staged") == 0;
  int args = argc - staged, n = atoi(argv[args - 1]);
  if (n >= 2 && n <= MAXR) {
    if (!getenv("RCCL_DEVICE")) setenv("NCCL_ALGO", staged ? "^symmetric" : "^oneshot", 1);
    if (args == 3 && strcmp(argv[1], "threads") == 0) code = threads(n, 0, staged);
    if (args == 3 && strcmp(argv[1], "emu") == 0 && !staged) code = threads(n, 1, 0);
    if (args == 4 && strcmp(argv[1], "rank") == 0) code = process(atoi(argv[2]), n, 0, staged);
    if (args == 4 && strcmp(argv[1], "emu") == 0 && !staged) code = process(atoi(argv[2]), n, 1, 0);
  }
  if (code == 2) {
    fprintf(stderr, "usage: symmetric threads N [staged] | rank R N [staged] | emu N | emu R N  (N in 2..%d)\n", MAXR);
    return 2;
  }
  if (failures) fprintf(stderr, "%d failure(s)\n", failures);
  else printf("ok\n");
  return failures ? 1 : 0;
}
