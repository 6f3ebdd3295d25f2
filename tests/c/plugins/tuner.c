/*
 * A minimal NCCL tuner plug-in for the tests, written from the ncclTuner
 * interface: it forces the algorithm TEST_TUNER_ALGO ("tree" or "ring")
 * with the Simple protocol and TEST_TUNER_CHANNELS channels. Built with
 * -DTUNER_V2 it exports ncclTunerPlugin_v2 (which names the algorithm);
 * otherwise ncclTunerPlugin_v6 (which zeroes that entry of the cost
 * table). Each decision is logged through NCCL's logger under NCCL_TUNING.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int ncclResult_t;
typedef int ncclFunc_t;
typedef void (*ncclDebugLogger_t)(int level, unsigned long flags, const char *file, int line,
                                  const char *fmt, ...);

#define NCCL_LOG_INFO 3
#define NCCL_TUNING 0x40
#define NCCL_ALGO_TREE 0
#define NCCL_ALGO_RING 1
#define NCCL_PROTO_SIMPLE 2
#define NUM_PROTOCOLS 3

struct context {
  ncclDebugLogger_t log;
  int algorithm, channels;
  size_t nranks, nnodes;
};

static ncclResult_t make_context(size_t nranks, size_t nnodes, ncclDebugLogger_t log,
                                 void **out) {
  struct context *c = calloc(1, sizeof *c);
  if (c == NULL) return 2;
  const char *algo = getenv("TEST_TUNER_ALGO");
  const char *channels = getenv("TEST_TUNER_CHANNELS");
  c->log = log;
  c->algorithm = algo && strcmp(algo, "ring") == 0 ? NCCL_ALGO_RING : NCCL_ALGO_TREE;
  c->channels = channels ? atoi(channels) : 0;
  c->nranks = nranks;
  c->nnodes = nnodes;
  log(NCCL_LOG_INFO, NCCL_TUNING, __FILE__, __LINE__,
      "test tuner: %zu ranks on %zu nodes, forcing %s with %d channels", nranks, nnodes,
      c->algorithm == NCCL_ALGO_RING ? "ring" : "tree", c->channels);
  *out = c;
  return 0;
}

static ncclResult_t release(void *context) {
  free(context);
  return 0;
}

#ifdef TUNER_V2
static ncclResult_t init_v2(size_t nranks, size_t nnodes, ncclDebugLogger_t log, void **context) {
  return make_context(nranks, nnodes, log, context);
}

static ncclResult_t get_coll_info_v2(void *context, ncclFunc_t coll, size_t bytes,
                                     int collnet, int nvls, int pipe_ops, int *algorithm,
                                     int *protocol, int *channels) {
  struct context *c = context;
  (void)collnet, (void)nvls, (void)pipe_ops;
  *algorithm = c->algorithm;
  *protocol = NCCL_PROTO_SIMPLE;
  *channels = c->channels;
  c->log(NCCL_LOG_INFO, NCCL_TUNING, __FILE__, __LINE__, "test tuner v2: coll %d, %zu bytes",
         coll, bytes);
  return 0;
}

typedef struct {
  const char *name;
  ncclResult_t (*init)(size_t, size_t, ncclDebugLogger_t, void **);
  ncclResult_t (*getCollInfo)(void *, ncclFunc_t, size_t, int, int, int, int *, int *, int *);
  ncclResult_t (*destroy)(void *);
} ncclTuner_v2_t;

const ncclTuner_v2_t ncclTunerPlugin_v2 = {"test-tuner-v2", init_v2, get_coll_info_v2, release};
#else
typedef struct {
  int nNvlDomains, minRanksPerNvlDomain, maxRanksPerNvlDomain;
} ncclNvlDomainInfo_v6_t;
typedef struct {
  double baseLatencies[7][3];
  double hwLatencies[3][7][3];
  double bandwidths[5][4][3];
} ncclTunerConstants_v6_t;

static ncclResult_t init_v6(void **context, uint64_t comm_id, size_t nranks, size_t nnodes,
                            ncclDebugLogger_t log, ncclNvlDomainInfo_v6_t *domains,
                            ncclTunerConstants_v6_t *constants) {
  (void)comm_id, (void)constants;
  if (domains->nNvlDomains != (int)nnodes) return 4;
  return make_context(nranks, nnodes, log, context);
}

static ncclResult_t get_coll_info_v6(void *context, ncclFunc_t coll, size_t bytes,
                                     int pipe_ops, float **cost_table, int num_algo,
                                     int num_proto, int reg_buff, int *channels) {
  struct context *c = context;
  float (*table)[NUM_PROTOCOLS] = (float (*)[NUM_PROTOCOLS])cost_table;
  (void)pipe_ops, (void)reg_buff;
  if (num_proto != NUM_PROTOCOLS || c->algorithm >= num_algo) return 4;
  /* Only an entry offered (not NCCL_ALGO_PROTO_IGNORE) can be picked. */
  if (table[c->algorithm][NCCL_PROTO_SIMPLE] >= 0) table[c->algorithm][NCCL_PROTO_SIMPLE] = 0.0f;
  *channels = c->channels;
  c->log(NCCL_LOG_INFO, NCCL_TUNING, __FILE__, __LINE__,
         "test tuner v6: coll %d, %zu bytes, ring/Simple cost %.2f us", coll, bytes,
         (double)table[NCCL_ALGO_RING][NCCL_PROTO_SIMPLE]);
  return 0;
}

typedef struct {
  const char *name;
  ncclResult_t (*init)(void **, uint64_t, size_t, size_t, ncclDebugLogger_t,
                       ncclNvlDomainInfo_v6_t *, ncclTunerConstants_v6_t *);
  ncclResult_t (*getCollInfo)(void *, ncclFunc_t, size_t, int, float **, int, int, int, int *);
  ncclResult_t (*finalize)(void *);
  ncclResult_t (*getChunkSize)(void *, ncclFunc_t, size_t, int, int, int, size_t *);
} ncclTuner_v6_t;

const ncclTuner_v6_t ncclTunerPlugin_v6 = {"test-tuner-v6", init_v6, get_coll_info_v6, release,
                                           NULL};
#endif
