/*
 * The C test suite of librcclrs: compiled against ffi/include/nccl.h and
 * against NVIDIA's nccl.h, linked as libnccl.so.2. Each case runs in its
 * own process: `suite <case>`; exit status 0 means it passed.
 */
#define _GNU_SOURCE
#include <nccl.h>

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "ranks.h"

#define N 4        /* ranks of the in-process cases */
#define COUNT 5    /* NCCL's per-rank count */
#define MAXLEN (COUNT * N)

/* The call fails with `want` and leaves a non-empty message. */
#define EXPECT_RC(call, want, comm)                                              \
  do {                                                                           \
    ncclResult_t rc_ = (call);                                                   \
    const char *msg_ = ncclGetLastError(comm);                                   \
    if (rc_ != (want) || msg_ == NULL || msg_[0] == 0) {                         \
      fprintf(stderr, "%s:%d: %s returned %d (want %d), message '%s'\n",         \
              __FILE__, __LINE__, #call, (int)rc_, (int)(want), msg_ ? msg_ : "(null)"); \
      failures++;                                                                \
    } else if (getenv("SUITE_VERBOSE")) {                                        \
      printf("  %s -> %s\n", #call, msg_);                                       \
    }                                                                            \
  } while (0)

/* ---- element encodings ------------------------------------------------ */

static int is_float(ncclDataType_t t) { return t >= ncclFloat16; }
/* Types with few significand bits get smaller values. */
static int is_narrow(ncclDataType_t t) {
  return t == ncclBfloat16 || t == ncclFloat8e4m3 || t == ncclFloat8e5m2;
}

/* A small float format: exact values only (the tests use no others). */
static uint32_t mini_encode(double v, int ebits, int mbits) {
  if (v == 0) return 0;
  uint32_t sign = v < 0;
  double a = fabs(v);
  int e = 0;
  while (a >= 2) { a /= 2; e++; }
  while (a < 1) { a *= 2; e--; }
  int bias = (1 << (ebits - 1)) - 1;
  uint32_t mant = (uint32_t)((a - 1) * (1 << mbits));
  return (sign << (ebits + mbits)) | ((uint32_t)(e + bias) << mbits) | mant;
}

static double mini_decode(uint32_t bits, int ebits, int mbits) {
  int bias = (1 << (ebits - 1)) - 1;
  uint32_t e = (bits >> mbits) & ((1u << ebits) - 1);
  uint32_t m = bits & ((1u << mbits) - 1);
  double sign = (bits >> (ebits + mbits)) & 1 ? -1 : 1;
  if (e == 0) return sign * ldexp((double)m / (1 << mbits), 1 - bias);
  return sign * ldexp(1 + (double)m / (1 << mbits), (int)e - bias);
}

static void enc(ncclDataType_t t, void *buf, size_t i, double v) {
  switch (t) {
  case ncclInt8: ((int8_t *)buf)[i] = (int8_t)(int64_t)v; break;
  case ncclUint8: ((uint8_t *)buf)[i] = (uint8_t)(int64_t)v; break;
  case ncclInt32: ((int32_t *)buf)[i] = (int32_t)(int64_t)v; break;
  case ncclUint32: ((uint32_t *)buf)[i] = (uint32_t)(int64_t)v; break;
  case ncclInt64: ((int64_t *)buf)[i] = (int64_t)v; break;
  case ncclUint64: ((uint64_t *)buf)[i] = (uint64_t)(int64_t)v; break;
  case ncclFloat16: ((uint16_t *)buf)[i] = (uint16_t)mini_encode(v, 5, 10); break;
  case ncclFloat32: ((float *)buf)[i] = (float)v; break;
  case ncclFloat64: ((double *)buf)[i] = v; break;
  case ncclBfloat16: ((uint16_t *)buf)[i] = (uint16_t)mini_encode(v, 8, 7); break;
  case ncclFloat8e4m3: ((uint8_t *)buf)[i] = (uint8_t)mini_encode(v, 4, 3); break;
  case ncclFloat8e5m2: ((uint8_t *)buf)[i] = (uint8_t)mini_encode(v, 5, 2); break;
  default: abort();
  }
}

static double dec(ncclDataType_t t, const void *buf, size_t i) {
  switch (t) {
  case ncclInt8: return ((const int8_t *)buf)[i];
  case ncclUint8: return ((const uint8_t *)buf)[i];
  case ncclInt32: return ((const int32_t *)buf)[i];
  case ncclUint32: return ((const uint32_t *)buf)[i];
  case ncclInt64: return (double)((const int64_t *)buf)[i];
  case ncclUint64: return (double)((const uint64_t *)buf)[i];
  case ncclFloat16: return mini_decode(((const uint16_t *)buf)[i], 5, 10);
  case ncclFloat32: return ((const float *)buf)[i];
  case ncclFloat64: return ((const double *)buf)[i];
  case ncclBfloat16: return mini_decode(((const uint16_t *)buf)[i], 8, 7);
  case ncclFloat8e4m3: return mini_decode(((const uint8_t *)buf)[i], 4, 3);
  case ncclFloat8e5m2: return mini_decode(((const uint8_t *)buf)[i], 5, 2);
  default: abort();
  }
}

/* The value as the type stores it (integer wrap-around included). */
static double as_type(ncclDataType_t t, double v) {
  unsigned char tmp[8];
  enc(t, tmp, 0, v);
  return dec(t, tmp, 0);
}

/* ---- data and expectations -------------------------------------------- */

/* Reduction inputs: exact under every op in every type. */
static double red_val(ncclDataType_t t, int rank, size_t i) {
  if (is_narrow(t)) return 1 + (double)((rank + i) % 2);
  return 1 + (double)((rank * 3 + i) % 5);
}

/* Distinct values naming (rank, index), exact in every type. */
static double id_val(ncclDataType_t t, int rank, size_t i) {
  static const double fp8[] = {0.25, 0.5, 0.75, 1, 1.5, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48};
  size_t k = (size_t)rank * MAXLEN + i;
  if (t == ncclFloat8e4m3 || t == ncclFloat8e5m2) return fp8[k % 15];
  return (double)(k % 100 + 1);
}

#define OP_PREMUL 5 /* the test's stand-in for a PreMulSum op (scalar 2) */

static double fold(ncclDataType_t t, int op, int nranks, size_t i, int nr) {
  double acc = 0;
  int64_t iacc = 0;
  (void)nranks;
  for (int r = 0; r < nr; r++) {
    double x = red_val(t, r, i);
    switch (op) {
    case ncclSum: case ncclAvg: acc = r ? acc + x : x; break;
    case ncclProd: acc = r ? acc * x : x; break;
    case ncclMax: acc = r ? fmax(acc, x) : x; break;
    case ncclMin: acc = r ? fmin(acc, x) : x; break;
    case OP_PREMUL: acc = r ? acc + 2 * x : 2 * x; break;
    }
  }
  if (op == ncclAvg) {
    if (is_float(t)) return acc / nr;
    iacc = (int64_t)acc / nr;
    return (double)iacc;
  }
  return as_type(t, acc);
}

enum kind { ALLREDUCE, BROADCAST, REDUCE, ALLGATHER, REDUCESCATTER, ALLTOALL, GATHER, SCATTER,
            BCAST_INPLACE, ALLREDUCE_INPLACE, NKINDS };
static const char *kind_name[] = {"AllReduce", "Broadcast", "Reduce", "AllGather",
                                  "ReduceScatter", "AlltoAll", "Gather", "Scatter",
                                  "Bcast(in place)", "AllReduce(in place)"};
static int reduces(int k) { return k == ALLREDUCE || k == REDUCE || k == REDUCESCATTER || k == ALLREDUCE_INPLACE; }

struct call {
  int kind, op, nranks, root;
  ncclDataType_t t;
};

struct rank_ctx {
  ncclComm_t comm;
  int rank;
  unsigned char send[MAXLEN * 8], recv[MAXLEN * 8];
  ncclRedOp_t op;
  ncclResult_t rc;
};

static void fill(const struct call *c, struct rank_ctx *x) {
  memset(x->recv, 0, sizeof x->recv);
  for (size_t i = 0; i < MAXLEN; i++) {
    enc(c->t, x->send, i, reduces(c->kind) ? red_val(c->t, x->rank, i) : id_val(c->t, x->rank, i));
  }
  if (c->kind == BCAST_INPLACE) memcpy(x->recv, x->send, sizeof x->send);
  if (c->kind == ALLREDUCE_INPLACE) memcpy(x->recv, x->send, sizeof x->send);
}

static ncclResult_t issue(const struct call *c, struct rank_ctx *x) {
  ncclComm_t comm = x->comm;
  ncclRedOp_t op = c->op == OP_PREMUL ? x->op : (ncclRedOp_t)c->op;
  cudaStream_t stream = (cudaStream_t)0;
  switch (c->kind) {
  case ALLREDUCE: return ncclAllReduce(x->send, x->recv, COUNT, c->t, op, comm, stream);
  case ALLREDUCE_INPLACE: return ncclAllReduce(x->recv, x->recv, COUNT, c->t, op, comm, stream);
  case BROADCAST: return ncclBroadcast(x->send, x->recv, COUNT, c->t, c->root, comm, stream);
  case BCAST_INPLACE: return ncclBcast(x->recv, COUNT, c->t, c->root, comm, stream);
  case REDUCE: return ncclReduce(x->send, x->recv, COUNT, c->t, op, c->root, comm, stream);
  case ALLGATHER: return ncclAllGather(x->send, x->recv, COUNT, c->t, comm, stream);
  case REDUCESCATTER: return ncclReduceScatter(x->send, x->recv, COUNT, c->t, op, comm, stream);
  case ALLTOALL: return ncclAlltoAll(x->send, x->recv, COUNT, c->t, comm, stream);
  case GATHER: return ncclGather(x->send, x->recv, COUNT, c->t, c->root, comm, stream);
  case SCATTER: return ncclScatter(x->send, x->recv, COUNT, c->t, c->root, comm, stream);
  }
  return ncclInternalError;
}

static int verify(const struct call *c, const struct rank_ctx *x) {
  int bad = 0, n = c->nranks, r = x->rank;
  size_t len = COUNT;
  if (c->kind == ALLGATHER || c->kind == ALLTOALL || (c->kind == GATHER && r == c->root)) len = COUNT * n;
  if ((c->kind == REDUCE || c->kind == GATHER) && r != c->root) return 0;
  for (size_t i = 0; i < len; i++) {
    double want = 0, got = dec(c->t, x->recv, i);
    size_t s = i / COUNT, j = i % COUNT;
    switch (c->kind) {
    case ALLREDUCE: case ALLREDUCE_INPLACE: case REDUCE: want = fold(c->t, c->op, n, i, n); break;
    case REDUCESCATTER: want = fold(c->t, c->op, n, (size_t)r * COUNT + i, n); break;
    case BROADCAST: case BCAST_INPLACE: want = as_type(c->t, id_val(c->t, c->root, i)); break;
    case ALLGATHER: case GATHER: want = as_type(c->t, id_val(c->t, (int)s, j)); break;
    case ALLTOALL: want = as_type(c->t, id_val(c->t, (int)s, (size_t)r * COUNT + j)); break;
    case SCATTER: want = as_type(c->t, id_val(c->t, c->root, (size_t)r * COUNT + i)); break;
    }
    if (got != want) {
      if (bad++ < 3)
        fprintf(stderr, "%s type %d op %d rank %d [%zu]: got %g, want %g\n", kind_name[c->kind],
                (int)c->t, c->op, r, i, got, want);
    }
  }
  return bad;
}

static void *thread_issue(void *arg) {
  void **a = arg;
  struct rank_ctx *x = a[1];
  x->rc = issue(a[0], x);
  return NULL;
}

enum mode { GROUPED, THREADS, SINGLE };

/* Runs one call on the local ranks and checks the results. */
static void run_call(struct call *c, struct rank_ctx *ctx, int nlocal, enum mode mode) {
  for (int l = 0; l < nlocal; l++) {
    fill(c, &ctx[l]);
    if (c->op == OP_PREMUL) {
      unsigned char scalar[8];
      enc(c->t, scalar, 0, 2);
      CHECK(ncclRedOpCreatePreMulSum(&ctx[l].op, scalar, c->t, ncclScalarHostImmediate, ctx[l].comm));
      EXPECT((int)ctx[l].op >= (int)ncclNumOps);
    }
  }
  if (mode == GROUPED) {
    CHECK(ncclGroupStart());
    for (int l = 0; l < nlocal; l++) CHECK(issue(c, &ctx[l]));
    CHECK(ncclGroupEnd());
  } else if (mode == THREADS) {
    pthread_t th[N];
    void *args[N][2];
    for (int l = 0; l < nlocal; l++) {
      args[l][0] = c;
      args[l][1] = &ctx[l];
      pthread_create(&th[l], NULL, thread_issue, args[l]);
    }
    for (int l = 0; l < nlocal; l++) {
      pthread_join(th[l], NULL);
      if (ctx[l].rc != ncclSuccess) {
        fprintf(stderr, "%s: rank %d returned %d: %s\n", kind_name[c->kind], ctx[l].rank,
                (int)ctx[l].rc, ncclGetLastError(ctx[l].comm));
        failures++;
      }
    }
  } else {
    CHECK(issue(c, &ctx[0]));
  }
  for (int l = 0; l < nlocal; l++) {
    failures += verify(c, &ctx[l]) ? 1 : 0;
    if (c->op == OP_PREMUL) CHECK(ncclRedOpDestroy(ctx[l].op, ctx[l].comm));
  }
}

/* Every collective x datatype x op. Returns the number of calls. */
static int matrix(struct rank_ctx *ctx, int nlocal, int nranks, enum mode mode) {
  int calls = 0;
  for (int k = 0; k < NKINDS; k++) {
    for (int t = 0; t < ncclNumTypes; t++) {
      int nops = reduces(k) ? OP_PREMUL + 1 : 1;
      for (int op = 0; op < nops; op++) {
        struct call c = {k, op, nranks, nranks - 1, (ncclDataType_t)t};
        run_call(&c, ctx, nlocal, mode);
        calls++;
      }
    }
  }
  return calls;
}

static struct rank_ctx ctx[N];

static void init_all(void) {
  ncclComm_t comms[N];
  int devs[N] = {3, 2, 1, 0};
  CHECK(ncclCommInitAll(comms, N, devs));
  for (int r = 0; r < N; r++) {
    int rank, count, dev;
    CHECK(ncclCommUserRank(comms[r], &rank));
    CHECK(ncclCommCount(comms[r], &count));
    CHECK(ncclCommCuDevice(comms[r], &dev));
    EXPECT(rank == r && count == N && dev == devs[r]);
    ctx[r].comm = comms[r];
    ctx[r].rank = r;
  }
}

static void *finalize_thread(void *p) {
  struct rank_ctx *x = p;
  x->rc = ncclCommFinalize(x->comm);
  return NULL;
}

/* ncclCommFinalize waits for every rank: one thread per rank. */
static void finalize_all(void) {
  pthread_t th[N];
  for (int r = 0; r < N; r++) pthread_create(&th[r], NULL, finalize_thread, &ctx[r]);
  for (int r = 0; r < N; r++) {
    pthread_join(th[r], NULL);
    CHECK(ctx[r].rc);
  }
}

static void destroy_all(void) {
  for (int r = 0; r < N; r++) CHECK(ncclCommDestroy(ctx[r].comm));
}

/* ---- cases -------------------------------------------------------------- */

static void case_version(void) {
  int v = 0;
  CHECK(ncclGetVersion(&v));
  EXPECT(v == NCCL_VERSION_CODE);
  EXPECT(v == NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH));
  EXPECT(v >= NCCL_VERSION(2, 32, 0));
  EXPECT(strcmp(ncclGetErrorString(ncclSuccess), "no error") == 0);
  for (int rc = 0; rc <= ncclNumResults; rc++) EXPECT(strlen(ncclGetErrorString((ncclResult_t)rc)) > 0);
  printf("version %d\n", v);
}

static void case_matrix_group(void) {
  init_all();
  printf("%d calls, all ranks from one thread in groups\n", matrix(ctx, N, N, GROUPED));
  destroy_all();
}

static void case_matrix_threads(void) {
  init_all();
  printf("%d calls, one pthread per rank\n", matrix(ctx, N, N, THREADS));
  destroy_all();
}

struct init_arg {
  ncclUniqueId id;
  int rank;
  ncclComm_t comm;
  ncclResult_t rc;
};

static void *init_rank_thread(void *p) {
  struct init_arg *a = p;
  a->rc = ncclCommInitRank(&a->comm, N, a->id, a->rank);
  return NULL;
}

/* ncclGetUniqueId + ncclCommInitRank from N pthreads. */
static void case_init_rank_threads(void) {
  struct init_arg args[N];
  pthread_t th[N];
  ncclUniqueId id;
  CHECK(ncclGetUniqueId(&id));
  for (int r = 0; r < N; r++) {
    args[r].id = id;
    args[r].rank = r;
    pthread_create(&th[r], NULL, init_rank_thread, &args[r]);
  }
  for (int r = 0; r < N; r++) {
    pthread_join(th[r], NULL);
    CHECK(args[r].rc);
    ctx[r].comm = args[r].comm;
    ctx[r].rank = r;
  }
  struct call c = {ALLREDUCE, ncclSum, N, 0, ncclFloat32};
  run_call(&c, ctx, N, THREADS);
  destroy_all();
}

/* ncclCommInitRank for every rank from one thread inside a group. */
static void case_init_rank_group(void) {
  ncclUniqueId id;
  CHECK(ncclGetUniqueId(&id));
  CHECK(ncclGroupStart());
  for (int r = 0; r < N; r++) {
    CHECK(ncclCommInitRank(&ctx[r].comm, N, id, r));
    ctx[r].rank = r;
  }
  CHECK(ncclGroupEnd());
  for (int r = 0; r < N; r++) {
    int rank;
    CHECK(ncclCommUserRank(ctx[r].comm, &rank));
    EXPECT(rank == r);
  }
  struct call c = {ALLGATHER, ncclSum, N, 0, ncclInt64};
  run_call(&c, ctx, N, GROUPED);
  destroy_all();
}

/* Non-blocking creation from one thread: ncclInProgress, then polled. */
static void case_nonblocking(void) {
  ncclUniqueId id;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  config.commName = "nonblocking-test";
  config.minCTAs = 1;
  config.maxCTAs = 4;
  CHECK(ncclGetUniqueId(&id));
  for (int r = 0; r < N; r++) {
    ncclResult_t rc = ncclCommInitRankConfig(&ctx[r].comm, N, id, r, &config);
    EXPECT(rc == ncclInProgress || rc == ncclSuccess);
    ctx[r].rank = r;
  }
  for (int r = 0; r < N; r++) {
    ncclResult_t state;
    do {
      CHECK(ncclCommGetAsyncError(ctx[r].comm, &state));
    } while (state == ncclInProgress);
    CHECK(state);
  }
  struct call c = {REDUCESCATTER, ncclMax, N, 0, ncclBfloat16};
  run_call(&c, ctx, N, GROUPED);
  finalize_all();
  destroy_all();
}

/* Every rank sends distinct data to every rank in one group. */
static void p2p_all_to_all(int nlocal, enum mode mode) {
  static int32_t out[N][N][COUNT], in[N][N][COUNT];
  for (int r = 0; r < N; r++)
    for (int p = 0; p < N; p++)
      for (int i = 0; i < COUNT; i++) {
        out[r][p][i] = r * 1000 + p * 10 + i;
        in[r][p][i] = -1;
      }
  if (mode == GROUPED) {
    CHECK(ncclGroupStart());
    for (int r = 0; r < nlocal; r++)
      for (int p = 0; p < N; p++) {
        CHECK(ncclSend(out[r][p], COUNT, ncclInt32, p, ctx[r].comm, NULL));
        CHECK(ncclRecv(in[r][p], COUNT, ncclInt32, p, ctx[r].comm, NULL));
      }
    CHECK(ncclGroupEnd());
  }
  for (int r = 0; r < nlocal; r++)
    for (int p = 0; p < N; p++)
      for (int i = 0; i < COUNT; i++) EXPECT(in[r][p][i] == p * 1000 + r * 10 + i);
}

static void *p2p_thread(void *p) {
  struct rank_ctx *x = p;
  static int32_t out[N][N], in[N][N];
  int r = x->rank;
  for (int q = 0; q < N; q++) out[r][q] = r * 100 + q;
  x->rc = ncclGroupStart();
  for (int q = 0; q < N && x->rc == ncclSuccess; q++) {
    x->rc = ncclSend(&out[r][q], 1, ncclInt32, q, x->comm, NULL);
    if (x->rc == ncclSuccess) x->rc = ncclRecv(&in[r][q], 1, ncclInt32, q, x->comm, NULL);
  }
  ncclResult_t end = ncclGroupEnd();
  if (x->rc == ncclSuccess) x->rc = end;
  for (int q = 0; q < N; q++)
    if (in[r][q] != q * 100 + r) x->rc = ncclInternalError;
  return NULL;
}

static void case_p2p(void) {
  init_all();
  p2p_all_to_all(N, GROUPED);
  pthread_t th[N];
  for (int r = 0; r < N; r++) pthread_create(&th[r], NULL, p2p_thread, &ctx[r]);
  for (int r = 0; r < N; r++) {
    pthread_join(th[r], NULL);
    CHECK(ctx[r].rc);
  }
  /* A ring of sends in one group, per data type. */
  for (int t = 0; t < ncclNumTypes; t++) {
    unsigned char out[N][COUNT * 8], in[N][COUNT * 8];
    CHECK(ncclGroupStart());
    for (int r = 0; r < N; r++) {
      for (int i = 0; i < COUNT; i++) enc((ncclDataType_t)t, out[r], (size_t)i, id_val((ncclDataType_t)t, r, (size_t)i));
      CHECK(ncclSend(out[r], COUNT, (ncclDataType_t)t, (r + 1) % N, ctx[r].comm, NULL));
      CHECK(ncclRecv(in[r], COUNT, (ncclDataType_t)t, (r + N - 1) % N, ctx[r].comm, NULL));
    }
    CHECK(ncclGroupEnd());
    for (int r = 0; r < N; r++)
      for (int i = 0; i < COUNT; i++)
        EXPECT(dec((ncclDataType_t)t, in[r], (size_t)i) == as_type((ncclDataType_t)t, id_val((ncclDataType_t)t, (r + N - 1) % N, (size_t)i)));
  }
  destroy_all();
}

/* Split from one thread in a group: colors rank % 2, keys reversing the
 * order, rank 3 opting out. */
static void case_split(void) {
  init_all();
  ncclComm_t sub[N];
  CHECK(ncclGroupStart());
  for (int r = 0; r < N; r++) {
    int color = r == 3 ? NCCL_SPLIT_NOCOLOR : r % 2;
    CHECK(ncclCommSplit(ctx[r].comm, color, -r, &sub[r], NULL));
  }
  CHECK(ncclGroupEnd());
  EXPECT(sub[3] == NULL);
  int rank, count;
  CHECK(ncclCommCount(sub[0], &count));
  EXPECT(count == 2);
  CHECK(ncclCommUserRank(sub[0], &rank));
  EXPECT(rank == 1); /* key 0 sorts after key -2 */
  CHECK(ncclCommUserRank(sub[2], &rank));
  EXPECT(rank == 0);
  CHECK(ncclCommCount(sub[1], &count));
  EXPECT(count == 1);
  /* An all-reduce on the even communicator. */
  float a[2] = {1, 2}, b[2] = {10, 20}, ra[2], rb[2];
  CHECK(ncclGroupStart());
  CHECK(ncclAllReduce(a, ra, 2, ncclFloat, ncclSum, sub[0], NULL));
  CHECK(ncclAllReduce(b, rb, 2, ncclFloat, ncclSum, sub[2], NULL));
  CHECK(ncclGroupEnd());
  EXPECT(ra[0] == 11 && ra[1] == 22 && rb[0] == 11 && rb[1] == 22);
  float c1 = 5, r1 = 0;
  CHECK(ncclAllReduce(&c1, &r1, 1, ncclFloat, ncclSum, sub[1], NULL));
  EXPECT(r1 == 5);
  for (int r = 0; r < 3; r++) CHECK(ncclCommDestroy(sub[r]));
  destroy_all();
}

struct shrink_arg {
  struct rank_ctx *x;
  ncclComm_t out;
  ncclResult_t rc;
};

static void *shrink_thread(void *p) {
  struct shrink_arg *a = p;
  int excluded[1] = {2};
  a->rc = ncclCommShrink(a->x->comm, excluded, 1, &a->out, NULL, NCCL_SHRINK_DEFAULT);
  if (a->rc == ncclSuccess) {
    int v = a->x->rank, sum = 0;
    a->rc = ncclAllReduce(&v, &sum, 1, ncclInt, ncclSum, a->out, NULL);
    if (a->rc == ncclSuccess && sum != 0 + 1 + 3) a->rc = ncclInternalError;
  }
  return NULL;
}

/* Rank 2 is excluded and does not call; the others shrink from threads. */
static void case_shrink(void) {
  init_all();
  struct shrink_arg args[N];
  pthread_t th[N];
  for (int r = 0; r < N; r++) {
    args[r].x = &ctx[r];
    if (r != 2) pthread_create(&th[r], NULL, shrink_thread, &args[r]);
  }
  for (int r = 0; r < N; r++) {
    if (r == 2) continue;
    pthread_join(th[r], NULL);
    CHECK(args[r].rc);
    int rank, count;
    CHECK(ncclCommUserRank(args[r].out, &rank));
    CHECK(ncclCommCount(args[r].out, &count));
    EXPECT(count == 3 && rank == (r < 2 ? r : r - 1));
    CHECK(ncclCommDestroy(args[r].out));
  }
  int excluded[1] = {1};
  ncclComm_t out;
  EXPECT_RC(ncclCommShrink(ctx[1].comm, excluded, 1, &out, NULL, 0), ncclInvalidArgument, ctx[1].comm);
  destroy_all();
}

/* PreMulSum with a scalar read through a pointer at each call. */
static void case_premulsum(void) {
  init_all();
  double scalar[N];
  ncclRedOp_t ops[N];
  double in[N][3], out[N][3];
  for (int r = 0; r < N; r++) {
    scalar[r] = 0.5;
    CHECK(ncclRedOpCreatePreMulSum(&ops[r], &scalar[r], ncclFloat64, ncclScalarDevice, ctx[r].comm));
    for (int i = 0; i < 3; i++) in[r][i] = r + i;
  }
  for (int round = 0; round < 2; round++) {
    CHECK(ncclGroupStart());
    for (int r = 0; r < N; r++) CHECK(ncclAllReduce(in[r], out[r], 3, ncclDouble, ops[r], ctx[r].comm, NULL));
    CHECK(ncclGroupEnd());
    for (int r = 0; r < N; r++)
      for (int i = 0; i < 3; i++) EXPECT(out[r][i] == scalar[0] * (6 + 4 * i));
    for (int r = 0; r < N; r++) scalar[r] = 3; /* read again by the next call */
  }
  /* An op is tied to its datatype and its communicator. */
  EXPECT_RC(ncclAllReduce(in[0], out[0], 3, ncclFloat32, ops[0], ctx[0].comm, NULL), ncclInvalidArgument, ctx[0].comm);
  for (int r = 0; r < N; r++) CHECK(ncclRedOpDestroy(ops[r], ctx[r].comm));
  EXPECT_RC(ncclRedOpDestroy(ops[0], ctx[0].comm), ncclInvalidArgument, ctx[0].comm);
  EXPECT_RC(ncclAllReduce(in[0], out[0], 3, ncclDouble, ops[0], ctx[0].comm, NULL), ncclInvalidArgument, ctx[0].comm);
  EXPECT_RC(ncclRedOpDestroy(ncclSum, ctx[0].comm), ncclInvalidArgument, ctx[0].comm);
  destroy_all();
}

static void case_errors(void) {
  init_all();
  ncclComm_t c0 = ctx[0].comm;
  float buf[MAXLEN] = {0}, out[MAXLEN];
  EXPECT_RC(ncclGetVersion(NULL), ncclInvalidArgument, NULL);
  EXPECT_RC(ncclGetUniqueId(NULL), ncclInvalidArgument, NULL);
  EXPECT_RC(ncclAllReduce(buf, out, 4, ncclFloat, ncclSum, NULL, NULL), ncclInvalidArgument, NULL);
  EXPECT_RC(ncclAllReduce(NULL, out, 4, ncclFloat, ncclSum, c0, NULL), ncclInvalidArgument, c0);
  EXPECT_RC(ncclAllReduce(buf, NULL, 4, ncclFloat, ncclSum, c0, NULL), ncclInvalidArgument, c0);
  EXPECT_RC(ncclAllReduce(buf, out, 4, (ncclDataType_t)99, ncclSum, c0, NULL), ncclInvalidArgument, c0);
  EXPECT_RC(ncclAllReduce(buf, out, 4, (ncclDataType_t)-1, ncclSum, c0, NULL), ncclInvalidArgument, c0);
  EXPECT_RC(ncclAllReduce(buf, out, 4, ncclFloat, (ncclRedOp_t)42, c0, NULL), ncclInvalidArgument, c0);
  EXPECT_RC(ncclAllReduce(buf, out, 4, ncclFloat, (ncclRedOp_t)-3, c0, NULL), ncclInvalidArgument, c0);
  EXPECT_RC(ncclAllGather(buf, out, SIZE_MAX / 2, ncclFloat, c0, NULL), ncclInvalidArgument, c0);
  EXPECT_RC(ncclBroadcast(buf, out, 4, ncclFloat, N, c0, NULL), ncclInvalidArgument, c0);
  EXPECT_RC(ncclReduce(buf, out, 4, ncclFloat, ncclSum, -1, c0, NULL), ncclInvalidArgument, c0);
  EXPECT_RC(ncclGather(buf, out, 4, ncclFloat, 17, c0, NULL), ncclInvalidArgument, c0);
  EXPECT_RC(ncclScatter(buf, out, 4, ncclFloat, 4, c0, NULL), ncclInvalidArgument, c0);
  EXPECT_RC(ncclBcast(buf, 4, ncclFloat, N + 1, c0, NULL), ncclInvalidArgument, c0);
  EXPECT_RC(ncclSend(buf, 4, ncclFloat, N, c0, NULL), ncclInvalidArgument, c0);
  EXPECT_RC(ncclRecv(buf, 4, ncclFloat, -1, c0, NULL), ncclInvalidArgument, c0);
  EXPECT_RC(ncclSend(NULL, 4, ncclFloat, 1, c0, NULL), ncclInvalidArgument, c0);
  EXPECT_RC(ncclCommCount(c0, NULL), ncclInvalidArgument, c0);
  EXPECT_RC(ncclCommUserRank((ncclComm_t)(uintptr_t)0x1234, (int *)buf), ncclInvalidArgument, NULL);
  /* The message names what was wrong. */
  ncclAllReduce(buf, out, 4, ncclFloat, (ncclRedOp_t)42, c0, NULL);
  EXPECT(strstr(ncclGetLastError(c0), "42") != NULL);
  EXPECT(strstr(ncclGetLastError(NULL), "ncclAllReduce") != NULL);
  ncclBroadcast(buf, out, 4, ncclFloat, 9, c0, NULL);
  EXPECT(strstr(ncclGetLastError(NULL), "root 9") != NULL);

  /* An error inside a group fails the group and runs none of it. */
  CHECK(ncclGroupStart());
  for (int r = 0; r < N; r++) ncclAllReduce(buf, out, 4, ncclFloat, r == 2 ? (ncclRedOp_t)77 : ncclSum, ctx[r].comm, NULL);
  EXPECT_RC(ncclGroupEnd(), ncclInvalidArgument, NULL);
  EXPECT_RC(ncclGroupEnd(), ncclInvalidUsage, NULL);
  /* The communicators still work. */
  struct call c = {ALLREDUCE, ncclSum, N, 0, ncclInt32};
  run_call(&c, ctx, N, GROUPED);

  /* Creation errors. */
  ncclComm_t comm;
  ncclUniqueId id;
  ncclConfig_t bad = NCCL_CONFIG_INITIALIZER;
  CHECK(ncclGetUniqueId(&id));
  EXPECT_RC(ncclCommInitRank(NULL, 2, id, 0), ncclInvalidArgument, NULL);
  EXPECT_RC(ncclCommInitRank(&comm, 0, id, 0), ncclInvalidArgument, NULL);
  EXPECT_RC(ncclCommInitRank(&comm, 2, id, 2), ncclInvalidArgument, NULL);
  EXPECT_RC(ncclCommInitAll(&comm, 0, NULL), ncclInvalidArgument, NULL);
  bad.magic = 0;
  EXPECT_RC(ncclCommInitRankConfig(&comm, 1, id, 0, &bad), ncclInvalidArgument, NULL);
  bad.magic = NCCL_API_MAGIC;
  bad.minCTAs = 8;
  bad.maxCTAs = 2;
  EXPECT_RC(ncclCommInitRankConfig(&comm, 1, id, 0, &bad), ncclInvalidArgument, NULL);
  memset(&id, 0, sizeof id);
  EXPECT_RC(ncclCommInitRank(&comm, 1, id, 0), ncclInvalidArgument, NULL);
  EXPECT_RC(ncclCommSplit(c0, -5, 0, &comm, NULL), ncclInvalidArgument, c0);

  /* A simulated group runs nothing and reports an estimate (us); a bad
     simInfo fails with the group closed. */
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER, bad_sim = NCCL_SIM_INFO_INITIALIZER;
  for (int i = 0; i < MAXLEN; i++) out[i] = -7.0f;
  CHECK(ncclGroupStart());
  CHECK(ncclAllReduce(buf, out, 4, ncclFloat, ncclSum, c0, NULL));
  CHECK(ncclGroupSimulateEnd(&sim));
  EXPECT(sim.estimatedTime > 0.0f);
  EXPECT(out[0] == -7.0f && out[3] == -7.0f);
  EXPECT_RC(ncclGroupSimulateEnd(&sim), ncclInvalidUsage, NULL);
  bad_sim.magic = 0;
  CHECK(ncclGroupStart());
  CHECK(ncclAllReduce(buf, out, 4, ncclFloat, ncclSum, c0, NULL));
  EXPECT_RC(ncclGroupSimulateEnd(&bad_sim), ncclInvalidArgument, NULL);
  EXPECT(strstr(ncclGetLastError(NULL), "NCCL_SIM_INFO_INITIALIZER") != NULL);
  EXPECT_RC(ncclGroupEnd(), ncclInvalidUsage, NULL);
  EXPECT(out[0] == -7.0f);
  /* Sends and receives are estimated from this rank's side (the peer never
     posts its calls, and nothing waits for it); they add to the group's
     collectives. */
  ncclSimInfo_t p2p = NCCL_SIM_INFO_INITIALIZER, both = NCCL_SIM_INFO_INITIALIZER;
  CHECK(ncclGroupStart());
  CHECK(ncclSend(buf, 4, ncclFloat, 1, c0, NULL));
  CHECK(ncclRecv(out, 4, ncclFloat, 1, c0, NULL));
  CHECK(ncclGroupSimulateEnd(&p2p));
  EXPECT(p2p.estimatedTime > 0.0f);
  CHECK(ncclGroupStart());
  CHECK(ncclAllReduce(buf, out, 4, ncclFloat, ncclSum, c0, NULL));
  CHECK(ncclSend(buf, 4, ncclFloat, 1, c0, NULL));
  CHECK(ncclRecv(out, 4, ncclFloat, 1, c0, NULL));
  CHECK(ncclGroupSimulateEnd(&both));
  EXPECT(both.estimatedTime > p2p.estimatedTime);
  EXPECT(out[0] == -7.0f && out[3] == -7.0f);

  /* Signals come with the first window (one_sided.c tests them). */
  EXPECT_RC(ncclSignal(1, 0, 0, 0, c0, NULL), ncclInvalidUsage, c0);
  EXPECT_RC(ncclPutSignal(buf, 1, ncclFloat, 1, NULL, 0, 0, 0, 0, c0, NULL), ncclInvalidUsage, c0);
  EXPECT_RC(ncclWaitSignal(0, NULL, c0, NULL), ncclInvalidArgument, c0);
  EXPECT_RC(ncclCommRevoke(c0, 0), ncclInvalidUsage, c0);
  /* NCCL's device-side API (declared by nccl_device/core.h, which programs
     that use it include): exported, since PyTorch imports it, and refused. */
  {
    extern ncclResult_t ncclDevCommCreate(ncclComm_t, const void *, void *);
    extern ncclResult_t ncclDevCommDestroy(ncclComm_t, const void *);
    extern ncclResult_t ncclGetPeerDevicePointer(ncclWindow_t, size_t, int, void **);
    extern ncclResult_t ncclGetLsaMultimemDevicePointer(ncclWindow_t, size_t, void **);
    void *ptr = NULL;
    EXPECT_RC(ncclDevCommCreate(c0, NULL, buf), ncclInvalidUsage, c0);
    EXPECT_RC(ncclDevCommDestroy(c0, buf), ncclInvalidUsage, c0);
    EXPECT_RC(ncclGetPeerDevicePointer(NULL, 0, 1, &ptr), ncclInvalidUsage, NULL);
    EXPECT_RC(ncclGetLsaMultimemDevicePointer(NULL, 0, &ptr), ncclInvalidUsage, NULL);
  }

  /* Destroyed and aborted communicators are reported, not used. */
  ncclComm_t gone = ctx[3].comm;
  CHECK(ncclCommAbort(ctx[3].comm));
  EXPECT_RC(ncclAllReduce(buf, out, 4, ncclFloat, ncclSum, gone, NULL), ncclInvalidUsage, NULL);
  EXPECT(strstr(ncclGetLastError(NULL), "destroyed") != NULL);
  EXPECT_RC(ncclCommDestroy(gone), ncclInvalidUsage, NULL);
  EXPECT_RC(ncclCommCount(gone, (int *)buf), ncclInvalidUsage, gone);
  CHECK(ncclCommDestroy(NULL));
  for (int r = 0; r < 3; r++) CHECK(ncclCommDestroy(ctx[r].comm));
  EXPECT_RC(ncclCommUserRank(ctx[0].comm, (int *)buf), ncclInvalidUsage, NULL);
}

static void case_misc(void) {
  init_all();
  ncclComm_t c0 = ctx[0].comm;
  void *mem = NULL, *handle = NULL, *user = NULL;
  CHECK(ncclMemAlloc(&mem, 1 << 20));
  EXPECT(mem != NULL && ((uintptr_t)mem % 4096) == 0);
  memset(mem, 1, 1 << 20);
  CHECK(ncclCommRegister(c0, mem, 1 << 20, &handle));
  EXPECT(handle != NULL);
  CHECK(ncclCommDeregister(c0, handle));
  EXPECT_RC(ncclCommDeregister(c0, handle), ncclInvalidArgument, c0);
  /* Windows are collective: one thread registers every rank's in a group. */
  ncclWindow_t win[N];
  CHECK(ncclGroupStart());
  for (int r = 0; r < N; r++) CHECK(ncclCommWindowRegister(ctx[r].comm, mem, 1 << 20, &win[r], NCCL_WIN_DEFAULT));
  CHECK(ncclGroupEnd());
  CHECK(ncclWinGetUserPtr(c0, win[0], &user));
  EXPECT(user == mem);
  CHECK(ncclGroupStart());
  for (int r = 0; r < N; r++) CHECK(ncclCommWindowDeregister(ctx[r].comm, win[r]));
  CHECK(ncclGroupEnd());
  CHECK(ncclMemFree(mem));
  CHECK(ncclMemFree(NULL));

  /* Nothing connected yet: the communicator holds only the signal blocks
     its first window made, which last as long as it (suspend and resume:
     memory.c). */
  uint64_t total = 0, persist = 0, suspendable = 99;
  CHECK(ncclCommMemStats(c0, ncclStatGpuMemTotal, &total));
  CHECK(ncclCommMemStats(c0, ncclStatGpuMemPersist, &persist));
  CHECK(ncclCommMemStats(c0, ncclStatGpuMemSuspend, &suspendable));
  EXPECT(total > 0 && total == persist && suspendable == 0);
  ncclResult_t async;
  CHECK(ncclCommGetAsyncError(c0, &async));
  EXPECT(async == ncclSuccess);

  ncclEncryptionConfig_t enc_config = NCCL_ENCRYPTION_CONFIG_INITIALIZER;
  CHECK(ncclSetEncryption(&enc_config));
  enc_config.mode = NCCL_ENCRYPTION_MODE_PSK;
  EXPECT_RC(ncclSetEncryption(&enc_config), ncclInvalidArgument, NULL);

  ncclParamHandle_t h;
  int64_t buffsize = 0;
  const char *text = NULL;
  CHECK(ncclParamBind(&h, "NCCL_BUFFSIZE"));
  CHECK(ncclParamGetI64(h, &buffsize));
  EXPECT(buffsize == 4194304);
  CHECK(ncclParamGetStr(h, &text));
  EXPECT(strcmp(text, "4194304") == 0);
  int len = 0;
  CHECK(ncclParamGetParameter("BUFFSIZE", &text, &len));
  EXPECT(len == 7);
  const char **keys = NULL;
  CHECK(ncclParamGetAllParameterKeys(&keys, &len));
  EXPECT(len > 0 && strcmp(keys[0], "NCCL_BUFFSIZE") == 0);
  /* A default that is this machine's: its last-level cache's size. */
  int64_t nt_store_bytes = 0;
  CHECK(ncclParamBind(&h, "RCCL_NT_STORE_BYTES"));
  CHECK(ncclParamGetI64(h, &nt_store_bytes));
  EXPECT(nt_store_bytes > 0);
  EXPECT_RC(ncclParamBind(&h, "NO_SUCH_PARAMETER"), ncclInvalidArgument, NULL);

  /* The collective variants with a per-call config. */
  ncclCollConfig_t cc = NCCL_COLLCONFIG_INITIALIZER;
  int32_t in[N], out[N];
  CHECK(ncclGroupStart());
  for (int r = 0; r < N; r++) {
    in[r] = r + 1;
    CHECK(ncclAllReduceConfig(&in[r], &out[r], 1, ncclInt32, ncclSum, ctx[r].comm, NULL, &cc));
  }
  CHECK(ncclGroupEnd());
  for (int r = 0; r < N; r++) EXPECT(out[r] == 10);
  finalize_all();
  destroy_all();
}

/* Ranks as processes: every collective, datatype and operator once. */
static void process_rank(int r, int P, ncclUniqueId id, void *unused) {
  (void)unused;
  struct rank_ctx *x = &ctx[0];
  CHECK(ncclCommInitRank(&x->comm, P, id, r));
  x->rank = r;
  int calls = 0;
  for (int k = 0; k < NKINDS; k++)
    for (int t = 0; t < ncclNumTypes; t += (k == ALLREDUCE ? 1 : 5)) {
      int nops = reduces(k) ? OP_PREMUL + 1 : 1;
      for (int op = 0; op < nops; op++) {
        struct call c = {k, op, P, 1, (ncclDataType_t)t};
        run_call(&c, x, 1, SINGLE);
        calls++;
      }
    }
  CHECK(ncclCommFinalize(x->comm));
  CHECK(ncclCommDestroy(x->comm));
  if (r == 0) printf("%d calls per process over %d processes\n", calls, P);
}

static void case_processes(void) {
  fork_ranks(N, NULL, process_rank, NULL); /* a power of two keeps ncclAvg exact */
}

/* Encryption: the misuses (encryption.c runs ranks with a key). */
static void case_encryption(void) {
  ncclEncryptionConfig_t bad = NCCL_ENCRYPTION_CONFIG_INITIALIZER;
  bad.magic = 0;
  EXPECT_RC(ncclSetEncryption(&bad), ncclInvalidArgument, NULL);
  ncclEncryptionConfig_t config = NCCL_ENCRYPTION_CONFIG_INITIALIZER;
  config.mode = NCCL_ENCRYPTION_MODE_PSK;
  EXPECT_RC(ncclSetEncryption(&config), ncclInvalidArgument, NULL); /* no psk */
  config.psk = "";
  EXPECT_RC(ncclSetEncryption(&config), ncclInvalidArgument, NULL);
  config.psk = "a-key-that-is-too-short-by-one!"; /* 31 bytes */
  EXPECT_RC(ncclSetEncryption(&config), ncclInvalidArgument, NULL);
  config.mode = 7;
  EXPECT_RC(ncclSetEncryption(&config), ncclInvalidArgument, NULL);
  config.mode = NCCL_ENCRYPTION_MODE_NONE;
  CHECK(ncclSetEncryption(&config));
  CHECK(ncclSetEncryption(NULL));
}

/* Grow: two ranks become three; the third joins with the id. */
struct grow_arg {
  ncclComm_t parent, out;
  ncclUniqueId *id;
  int rank;
  ncclResult_t rc;
};

static void *grow_thread(void *p) {
  struct grow_arg *a = p;
  a->rc = ncclCommGrow(a->parent, 3, a->id, a->rank, &a->out, NULL);
  if (a->rc == ncclSuccess) {
    int v = 1, sum = 0;
    a->rc = ncclAllReduce(&v, &sum, 1, ncclInt, ncclSum, a->out, NULL);
    if (a->rc == ncclSuccess && sum != 3) a->rc = ncclInternalError;
  }
  return NULL;
}

static void case_grow(void) {
  ncclComm_t comms[2];
  ncclUniqueId id;
  CHECK(ncclCommInitAll(comms, 2, NULL));
  CHECK(ncclCommGetUniqueId(comms[0], &id));
  struct grow_arg args[3] = {
      {comms[0], NULL, &id, -1, ncclSuccess},
      {comms[1], NULL, NULL, -1, ncclSuccess},
      {NULL, NULL, &id, 2, ncclSuccess},
  };
  pthread_t th[3];
  for (int i = 0; i < 3; i++) pthread_create(&th[i], NULL, grow_thread, &args[i]);
  for (int i = 0; i < 3; i++) {
    pthread_join(th[i], NULL);
    CHECK(args[i].rc);
    int rank;
    CHECK(ncclCommUserRank(args[i].out, &rank));
    EXPECT(rank == i);
    CHECK(ncclCommDestroy(args[i].out));
  }
  CHECK(ncclCommDestroy(comms[0]));
  CHECK(ncclCommDestroy(comms[1]));
}

static const struct {
  const char *name;
  void (*run)(void);
} cases[] = {
    {"version", case_version},
    {"matrix-group", case_matrix_group},
    {"matrix-threads", case_matrix_threads},
    {"init-rank-threads", case_init_rank_threads},
    {"init-rank-group", case_init_rank_group},
    {"nonblocking", case_nonblocking},
    {"p2p", case_p2p},
    {"split", case_split},
    {"shrink", case_shrink},
    {"grow", case_grow},
    {"premulsum", case_premulsum},
    {"errors", case_errors},
    {"misc", case_misc},
    {"processes", case_processes},
    {"encryption", case_encryption},
};

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s <case>|list\n", argv[0]);
    return 2;
  }
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    if (strcmp(argv[1], "list") == 0) {
      printf("%s\n", cases[i].name);
    } else if (strcmp(argv[1], cases[i].name) == 0) {
      cases[i].run();
      if (failures) fprintf(stderr, "%s: %d failures\n", cases[i].name, failures);
      else printf("%s: ok\n", cases[i].name);
      return failures ? 1 : 0;
    }
  }
  if (strcmp(argv[1], "list") == 0) return 0;
  fprintf(stderr, "unknown case %s\n", argv[1]);
  return 2;
}
