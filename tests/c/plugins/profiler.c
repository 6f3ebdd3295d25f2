/*
 * A minimal NCCL profiler plug-in for the tests, written from the
 * ncclProfiler interface. Built with -DPROFILER_VERSION=N (1 to 6, default
 * 6) it exports ncclProfiler_vN with that version's descriptor layout; with
 * -DPROFILER_SYMBOL_MISSING it exports no profiler table at all.
 *
 * Each context (one per communicator) asks for the events of the mask
 * TEST_PROFILER_MASK (default: group, collective and point-to-point),
 * counts the events it is given per type and checks their nesting: a
 * collective or point-to-point event's parent group is an open group
 * event of the same context, every stop is of an open event, no event
 * stops while a child is open, collective sequence numbers count each
 * function's calls from 0, and nothing is open at finalize. From v5 on,
 * the API events too: a call's API event is a child of the open group
 * API event (of the context of the group's first call), and a collective or point-to-point event's parentObj is the
 * API event of its call (stopped by then, as NCCL stops it once the call
 * is queued; API events are kept until finalize for this check). Proxy
 * operation events are children of an open collective event of the same
 * context, of this process, numbering their steps from 0; each proxy step
 * event is a child of an open proxy operation and gets one state of its
 * direction (SendWait or RecvGPUWait, with its size) before it stops; a
 * proxy operation gets its version's states (from v4 InProgress, before
 * it SendPosted / RecvPosted and SendDone / RecvDone). What it saw
 * goes to a file of the folder TEST_PROFILER_DIR at finalize. With
 * TEST_PROFILER_INIT_FAIL set, init fails.
 */
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#ifndef PROFILER_VERSION
#define PROFILER_VERSION 6
#endif

typedef int ncclResult_t;
typedef void (*ncclDebugLogger_t)(int level, unsigned long flags, const char *file, int line,
                                  const char *fmt, ...);

enum {
  GROUP = 1 << 0,
  COLL = 1 << 1,
  P2P = 1 << 2,
  PROXY_OP = 1 << 3,
  PROXY_STEP = 1 << 4,
  BELOW_TASK = 0xf << 3, /* proxy operation, step and control, kernel channel */
  NET_PLUGIN = 1 << 7,
  GROUP_API = 1 << 8,
  COLL_API = 1 << 9,
  P2P_API = 1 << 10,
};
#define NTYPES 8
static const char *type_names[NTYPES] = {"group",    "coll",     "p2p",      "group_api",
                                         "coll_api", "p2p_api",  "proxy_op", "proxy_step"};
static const uint64_t type_bits[NTYPES] = {GROUP,   COLL,    P2P,      GROUP_API,
                                           COLL_API, P2P_API, PROXY_OP, PROXY_STEP};
enum { T_COLL = 1, T_PROXY_OP = 6, T_PROXY_STEP = 7 };
/* ncclProfilerProxyOp... and ncclProfilerProxyStep... states. */
enum {
  OP_SEND_POSTED = 0,
  OP_SEND_DONE = 3,
  OP_RECV_POSTED = 4,
  OP_RECV_DONE = 7,
  STEP_SEND_WAIT = 9,
  STEP_RECV_GPU_WAIT = 12,
  OP_IN_PROGRESS = 19,
};

/* The collective and point-to-point members each version's union has,
 * in its layout; other members are not read. */
#if PROFILER_VERSION == 1
typedef uint8_t name_t;
struct coll {
  const char *name;
  uint64_t commHash;
  uint64_t seqNumber;
  uint8_t func;
  const void *sendBuff;
  void *recvBuff;
  size_t count;
  int root;
  uint8_t datatype;
  uint32_t op;
  size_t trafficBytes;
  uint8_t nChannels;
  uint8_t nWarps;
  uint8_t algo;
  uint8_t proto;
  int isCollnet;
  int isNvls;
};
struct p2p {
  const char *name;
  uint64_t commHash;
  uint8_t func;
  void *buff;
  uint8_t datatype;
  size_t count;
  int peer;
};
#elif PROFILER_VERSION <= 3
typedef const char *name_t;
struct coll {
  const char *name;
  uint64_t commHash;
  uint64_t seqNumber;
  const char *func;
  const void *sendBuff;
  void *recvBuff;
  size_t count;
  int root;
  const char *datatype;
#if PROFILER_VERSION == 2
  size_t trafficBytes;
#endif
  uint8_t nChannels;
  uint8_t nWarps;
  const char *algo;
  const char *proto;
};
struct p2p {
  const char *name;
  uint64_t commHash;
  const char *func;
  void *buff;
  const char *datatype;
  size_t count;
  int peer;
};
#else
typedef const char *name_t;
struct coll {
  uint64_t seqNumber;
  const char *func;
  const void *sendBuff;
  void *recvBuff;
  size_t count;
  int root;
  const char *datatype;
  uint8_t nChannels;
  uint8_t nWarps;
  const char *algo;
  const char *proto;
#if PROFILER_VERSION >= 5
  void *parentGroup;
#endif
};
struct p2p {
  const char *func;
  void *buff;
  const char *datatype;
  size_t count;
  int peer;
  uint8_t nChannels;
#if PROFILER_VERSION >= 5
  void *parentGroup;
#endif
};
#endif

struct descr {
#if PROFILER_VERSION >= 5
  uint64_t type;
#else
  uint8_t type;
#endif
  void *parentObj;
  int rank;
  union {
    struct coll coll;
    struct p2p p2p;
    struct {
      pid_t pid;
      uint8_t channelId;
      int peer;
      int nSteps;
      int chunkSize;
      int isSend;
    } proxyOp;
    struct {
      int step;
    } proxyStep;
    struct {
      bool graphCaptured;
      int groupDepth;
    } groupApi;
    struct {
      const char *func;
      size_t count;
      const char *datatype;
      int root;
      void *stream;
      bool graphCaptured;
    } collApi;
    struct {
      const char *func;
      size_t count;
      const char *datatype;
      void *stream;
      bool graphCaptured;
    } p2pApi;
  };
};

#define MAX_FUNCS 16
#define MAX_OPEN 4096

struct context {
  int id, rank, mask;
  long started[NTYPES], stopped[NTYPES];
  struct event *retired; /* stopped API events, kept until finalize */
  long errors;
  char first_error[256];
  uint64_t next_seq[MAX_FUNCS];
  char last_coll[256];
  long proxy_sends, proxy_recvs; /* proxy operations per direction */
};

struct event {
  struct context *ctx;
  int type; /* index into type_names */
  struct event *parent;
  int open_children;
  struct event *next_retired;
  int is_send;    /* a proxy operation's or step's direction */
  int next_step;  /* a proxy operation's next step number */
  int states;     /* states recorded */
  int last_state; /* the last of them */
};

/* Every open event of the process, so that a stop of anything else is
 * told instead of read. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct event *open_events[MAX_OPEN];
static int nopen;
static int contexts;

static void fail(struct context *ctx, const char *why) {
  if (ctx->errors++ == 0) snprintf(ctx->first_error, sizeof ctx->first_error, "%s", why);
}

static int find_open(const struct event *e) {
  for (int i = 0; i < nopen; i++)
    if (open_events[i] == e) return i;
  return -1;
}

static ncclResult_t make_context(void **out, int *mask, int rank) {
  if (getenv("TEST_PROFILER_INIT_FAIL")) return 2;
  struct context *ctx = calloc(1, sizeof *ctx);
  if (ctx == NULL) return 2;
  const char *m = getenv("TEST_PROFILER_MASK");
  ctx->mask = m ? (int)strtol(m, NULL, 0) : GROUP | COLL | P2P;
  ctx->rank = rank;
  pthread_mutex_lock(&lock);
  ctx->id = contexts++;
  pthread_mutex_unlock(&lock);
  *mask = ctx->mask;
  *out = ctx;
  return 0;
}

static int func_index(name_t func) {
#if PROFILER_VERSION == 1
  return func < MAX_FUNCS ? func : MAX_FUNCS - 1;
#else
  static const char *names[] = {"Broadcast", "Reduce", "AllGather", "ReduceScatter",
                                "AllReduce", "AlltoAll", "Gather", "Scatter"};
  for (int i = 0; i < 8; i++)
    if (func && strcmp(func, names[i]) == 0) return i;
  return MAX_FUNCS - 1;
#endif
}

static ncclResult_t start_event(void *context, void **handle, struct descr *d) {
  struct context *ctx = context;
  *handle = NULL;
  int type = -1;
  for (int t = 0; t < NTYPES; t++)
    if (d->type == type_bits[t]) type = t;
  pthread_mutex_lock(&lock);
  if (type < 0) {
    fail(ctx, "an event of a type the mask did not ask for");
    pthread_mutex_unlock(&lock);
    return 0;
  }
  struct event *parent = NULL;
  if (type == 4 || type == 5) {
    parent = d->parentObj;
    int found = parent ? find_open(parent) : -1;
    /* The group API event is the first call's communicator's. */
    if (found < 0 || parent->type != 3)
      fail(ctx, "a call's API event whose parent is not an open group API event");
    else
      parent->open_children++;
  }
#if PROFILER_VERSION >= 5
  if (type == 1 || type == 2) {
    struct event *api = ctx->retired;
    while (api && api != d->parentObj) api = api->next_retired;
    if (api == NULL || api->type != type + 3)
      fail(ctx, "a call event whose parentObj is not the API event of its call");
  }
#endif
  if (type == 1 || type == 2) {
#if PROFILER_VERSION >= 5
    parent = type == 1 ? d->coll.parentGroup : d->p2p.parentGroup;
#else
    parent = d->parentObj;
#endif
    if (parent != NULL) {
      int found = find_open(parent);
      if (found < 0 || parent->ctx != ctx || parent->type != 0)
        fail(ctx, "a call event whose parent is not an open group of its context");
      else
        parent->open_children++;
    } else if (ctx->mask & GROUP) {
      fail(ctx, "a call event without its group");
    }
  }
  int is_send = 0;
  if (type == T_PROXY_OP) {
    parent = d->parentObj;
    if (parent == NULL || find_open(parent) < 0 || parent->ctx != ctx || parent->type != T_COLL)
      fail(ctx, "a proxy operation whose parent is not an open collective of its context");
    else
      parent->open_children++;
    if (d->proxyOp.pid != getpid() || d->proxyOp.peer < 0 || d->proxyOp.chunkSize <= 0 ||
        (d->proxyOp.isSend != 0 && d->proxyOp.isSend != 1))
      fail(ctx, "a proxy operation of a bad pid, peer, size or direction");
    if (d->rank != ctx->rank && ctx->rank >= 0) fail(ctx, "a proxy operation of another rank");
    is_send = d->proxyOp.isSend;
    if (is_send)
      ctx->proxy_sends++;
    else
      ctx->proxy_recvs++;
  }
  if (type == T_PROXY_STEP) {
    parent = d->parentObj;
    if (parent == NULL || find_open(parent) < 0 || parent->ctx != ctx ||
        parent->type != T_PROXY_OP) {
      fail(ctx, "a proxy step whose parent is not an open proxy operation of its context");
      parent = NULL;
    } else {
      parent->open_children++;
      if (d->proxyStep.step != parent->next_step++) fail(ctx, "a proxy step out of sequence");
      is_send = parent->is_send;
    }
  }
  if (type == 1) {
    int f = func_index(d->coll.func);
    if (d->coll.seqNumber != ctx->next_seq[f]) fail(ctx, "a collective out of sequence");
    ctx->next_seq[f] = d->coll.seqNumber + 1;
    if (d->coll.count == 0 || d->coll.nChannels == 0) fail(ctx, "a collective of no count or no channels");
    if (d->rank != ctx->rank && ctx->rank >= 0) fail(ctx, "a collective of another rank");
#if PROFILER_VERSION == 1
    snprintf(ctx->last_coll, sizeof ctx->last_coll, "%d %d %d %d", d->coll.func,
             d->coll.datatype, d->coll.algo, d->coll.proto);
#else
    snprintf(ctx->last_coll, sizeof ctx->last_coll, "%s %s %s %s", d->coll.func,
             d->coll.datatype, d->coll.algo, d->coll.proto);
#endif
  }
  /* An event starts when the mask asks for it or for an event below it,
   * whose parent it is. */
  int below_call = BELOW_TASK | NET_PLUGIN;
  int wanted[NTYPES] = {
      GROUP | COLL | P2P | below_call,
      COLL | below_call,
      P2P | below_call,
      GROUP_API | COLL_API | P2P_API | GROUP | COLL | P2P | below_call | (0xf << 11),
      COLL_API | COLL | below_call | (0x7 << 12),
      P2P_API | P2P | below_call,
      PROXY_OP | PROXY_STEP | NET_PLUGIN,
      PROXY_STEP | NET_PLUGIN,
  };
  int asked = ctx->mask & wanted[type];
  if (!asked) fail(ctx, "an event the mask did not ask for");
  struct event *e = calloc(1, sizeof *e);
  if (e == NULL || nopen == MAX_OPEN) {
    free(e);
    fail(ctx, "too many open events");
    pthread_mutex_unlock(&lock);
    return 0;
  }
  e->ctx = ctx;
  e->type = type;
  e->parent = parent;
  e->is_send = is_send;
  e->last_state = -1;
  open_events[nopen++] = e;
  ctx->started[type]++;
  pthread_mutex_unlock(&lock);
  *handle = e;
  return 0;
}

static ncclResult_t stop_event(void *handle) {
  struct event *e = handle;
  pthread_mutex_lock(&lock);
  int at = find_open(e);
  if (at < 0) {
    /* No context to blame: every context reports it. */
    fprintf(stderr, "test profiler: stop of an event that is not open\n");
    pthread_mutex_unlock(&lock);
    abort();
  }
  if (e->open_children != 0) fail(e->ctx, "an event stopped before its children");
  if (e->type == T_PROXY_STEP && e->states != 1)
    fail(e->ctx, "a proxy step stopped without exactly one state");
  if (e->type == T_PROXY_OP) {
    int last = PROFILER_VERSION >= 4 ? OP_IN_PROGRESS : e->is_send ? OP_SEND_DONE : OP_RECV_DONE;
    if (e->last_state != last) fail(e->ctx, "a proxy operation stopped in the wrong state");
  }
  if (e->parent) e->parent->open_children--;
  e->ctx->stopped[e->type]++;
  open_events[at] = open_events[--nopen];
  if (e->type == 4 || e->type == 5) {
    e->next_retired = e->ctx->retired;
    e->ctx->retired = e;
  } else {
    free(e);
  }
  pthread_mutex_unlock(&lock);
  return 0;
}

static ncclResult_t record_event_state(void *handle, int state, void *args) {
  struct event *e = handle;
  pthread_mutex_lock(&lock);
  if (find_open(e) < 0) {
    pthread_mutex_unlock(&lock);
    fprintf(stderr, "test profiler: a state of an event that is not open\n");
    abort();
  }
  if (e->type == T_PROXY_STEP) {
    /* Both v1's proxyOp and v4's proxyStep arguments begin with the size. */
    size_t size = args ? *(const size_t *)args : 0;
    int want = e->is_send ? STEP_SEND_WAIT : STEP_RECV_GPU_WAIT;
    if (state != want || size == 0) fail(e->ctx, "a proxy step's state or size is wrong");
  }
  if (e->type == T_PROXY_OP) {
    int ok;
    if (PROFILER_VERSION >= 4)
      ok = state == OP_IN_PROGRESS && e->states == 0;
    else if (e->states == 0)
      ok = state == (e->is_send ? OP_SEND_POSTED : OP_RECV_POSTED);
    else
      ok = e->states == 1 && state == (e->is_send ? OP_SEND_DONE : OP_RECV_DONE);
    if (!ok) fail(e->ctx, "a proxy operation's state is out of order");
  }
  e->states++;
  e->last_state = state;
  pthread_mutex_unlock(&lock);
  return 0;
}

static ncclResult_t finalize(void *context) {
  struct context *ctx = context;
  pthread_mutex_lock(&lock);
  long still_open = 0;
  for (int i = 0; i < nopen; i++)
    if (open_events[i]->ctx == ctx) still_open++;
  pthread_mutex_unlock(&lock);
  if (still_open) fail(ctx, "events open at finalize");
  const char *dir = getenv("TEST_PROFILER_DIR");
  if (dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/profiler-%d-%d.txt", dir, (int)getpid(), ctx->id);
    FILE *f = fopen(path, "w");
    if (f) {
      fprintf(f, "version %d\nrank %d\n", PROFILER_VERSION, ctx->rank);
      for (int t = 0; t < NTYPES; t++)
        fprintf(f, "%s %ld %ld\n", type_names[t], ctx->started[t], ctx->stopped[t]);
      fprintf(f, "proxy_dirs %ld %ld\n", ctx->proxy_sends, ctx->proxy_recvs);
      fprintf(f, "open %ld\nerrors %ld\nfirst_error %s\nlast_coll %s\n", still_open, ctx->errors,
              ctx->first_error, ctx->last_coll);
      fclose(f);
    }
  }
  while (ctx->retired) {
    struct event *next = ctx->retired->next_retired;
    free(ctx->retired);
    ctx->retired = next;
  }
  free(ctx);
  return 0;
}

#if PROFILER_VERSION <= 3
static ncclResult_t init(void **context, int *mask) { return make_context(context, mask, -1); }
#elif PROFILER_VERSION == 4
static ncclResult_t init(void **context, int *mask, const char *name, uint64_t hash, int nnodes,
                         int nranks, int rank, ncclDebugLogger_t log) {
  (void)name, (void)hash, (void)nnodes, (void)nranks, (void)log;
  return make_context(context, mask, rank);
}
#else
static ncclResult_t init(void **context, uint64_t hash, int *mask, const char *name, int nnodes,
                         int nranks, int rank, ncclDebugLogger_t log) {
  (void)name, (void)hash, (void)nnodes, (void)nranks, (void)log;
  return make_context(context, mask, rank);
}
#endif

struct table {
  const char *name;
  __typeof__(init) *init;
  ncclResult_t (*start_event)(void *, void **, struct descr *);
  ncclResult_t (*stop_event)(void *);
  ncclResult_t (*record_event_state)(void *, int, void *);
  ncclResult_t (*finalize)(void *);
};

#define CAT(a, b) a##b
#define TABLE(v) CAT(ncclProfiler_v, v)
#define STR(x) #x
#define NAME(v) "test-profiler-v" STR(v)

#ifdef PROFILER_SYMBOL_MISSING
#define SYMBOL testProfilerTable
#else
#define SYMBOL TABLE(PROFILER_VERSION)
#endif

const struct table SYMBOL = {
    NAME(PROFILER_VERSION), init, start_event, stop_event, record_event_state, finalize,
};
