/*
 * The host side of NCCL's device API (<nccl_device/host.h>), compiled
 * against ffi/include and against NVIDIA's headers, linked as
 * libnccl.so.2. `device_host layout` prints the layouts (identical under
 * both headers); `device_host <case>` runs a case, exit status 0 = passed.
 */
#define _GNU_SOURCE
#include <nccl.h>
#include <nccl_device/host.h>

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "ranks.h"

/* Exported by NCCL's library without a declaration in its Linux headers. */
void ncclResetDebugInitInternal(void);
ncclResult_t ncclGinOutboxCreateRequirement(int nBlocks, int size_log2, void *outHandle,
                                            ncclDevResourceRequirements_t *outReq);
ncclResult_t ncclGinInboxA2ACreateRequirement(ncclTeam_t peers, int nBlocks, int size_log2,
                                              void *outHandle,
                                              ncclDevResourceRequirements_t *outReq);

/* The last error names `what`; printed so the test log shows the text. */
static void expect_message(ncclComm_t comm, const char *what) {
  const char *msg = ncclGetLastError(comm);
  if (msg == NULL || strstr(msg, what) == NULL) {
    fprintf(stderr, "expected a message with '%s', got '%s'\n", what, msg ? msg : "(null)");
    failures++;
  } else {
    printf("  %s\n", msg);
  }
}

#define EXPECT_UNSUPPORTED(call, what)           \
  do {                                           \
    EXPECT((call) == ncclInvalidUsage);          \
    expect_message(NULL, what);                  \
  } while (0)

static int team_is(ncclTeam_t t, int nRanks, int rank, int stride) {
  return t.nRanks == nRanks && t.rank == rank && t.stride == stride;
}

#define SIZE(t) printf("sizeof(%s) = %zu\n", #t, sizeof(t))
#define OFF(t, f) printf("offsetof(%s, %s) = %zu\n", #t, #f, offsetof(t, f))
#define VAL(e) printf("%s = %d\n", #e, (int)(e))

static void layout(void) {
  SIZE(ncclTeam_t); OFF(ncclTeam_t, nRanks); OFF(ncclTeam_t, rank); OFF(ncclTeam_t, stride);
  SIZE(ncclCommProperties_t);
  OFF(ncclCommProperties_t, rank); OFF(ncclCommProperties_t, nRanks);
  OFF(ncclCommProperties_t, cudaDev); OFF(ncclCommProperties_t, nvmlDev);
  OFF(ncclCommProperties_t, deviceApiSupport); OFF(ncclCommProperties_t, multimemSupport);
  OFF(ncclCommProperties_t, ginType); OFF(ncclCommProperties_t, nLsaTeams);
  OFF(ncclCommProperties_t, hostRmaSupport); OFF(ncclCommProperties_t, railedGinType);
  OFF(ncclCommProperties_t, commHash); OFF(ncclCommProperties_t, ginMinStride);
  OFF(ncclCommProperties_t, ginConnectionType); OFF(ncclCommProperties_t, ginSupport);
  OFF(ncclCommProperties_t, devCommRuntimeVersionSize); OFF(ncclCommProperties_t, cftSupport);
  OFF(ncclCommProperties_t, cftMulticastSupport); OFF(ncclCommProperties_t, cftCountedSupport);
  SIZE(ncclDevResourceRequirements_t); SIZE(ncclMultimemHandle_t); SIZE(ncclLsaBarrierHandle_t);
  SIZE(ncclGinBarrierHandle_t); SIZE(ncclLLA2AHandle_t); SIZE(ncclCftLeId);
  VAL(NCCL_GIN_TYPE_NONE); VAL(NCCL_GIN_TYPE_PROXY); VAL(NCCL_GIN_TYPE_GDAKI);
  VAL(NCCL_GIN_TYPE_GPI); VAL(NCCL_GIN_TYPE_EFA_GDA); VAL(NCCL_GIN_MAX_TYPES);
  VAL(NCCL_GIN_CONNECTION_NONE); VAL(NCCL_GIN_CONNECTION_FULL); VAL(NCCL_GIN_CONNECTION_RAIL);
  VAL(NCCL_GIN_CONNECTION_CUSTOM_STRIDE); VAL(NCCL_GIN_CONNECTION_CUSTOM_ARRAY);
  VAL(NCCL_CFT_TEAM_FLAT); VAL(NCCL_CFT_TEAM_HIER_MULTIMEM); VAL(NCCL_CFT_TEAM_HIER_LSA);
  ncclCommProperties_t props = NCCL_COMM_PROPERTIES_INITIALIZER;
  printf("initializer: size %zu magic %#x version %u\n", props.size, props.magic, props.version);
}

/*
 * Four ranks in four processes over two emulated hosts (NCCL_HOSTID):
 * `host_of(r)` picks each rank's host. Each rank checks its teams against
 * `want_lsa` ranks per LSA team and writes its commHash to the parent.
 */
struct teams {
  int (*host_of)(int);
  int want_lsa;
  int hashes[2];
};

static void teams_setup(int r, void *arg) {
  struct teams *t = arg;
  char host[16];
  snprintf(host, sizeof host, "host%d", t->host_of(r));
  setenv("NCCL_HOSTID", host, 1);
}

static void teams_rank(int r, int P, ncclUniqueId id, void *arg) {
  struct teams *t = arg;
  ncclComm_t comm;
  CHECK(ncclCommInitRank(&comm, P, id, r));

  ncclTeam_t world = ncclTeamWorld(comm), lsa = ncclTeamLsa(comm), rail = ncclTeamRail(comm);
  EXPECT(team_is(world, P, r, 1));
  EXPECT(team_is(lsa, t->want_lsa, r % t->want_lsa, 1));
  EXPECT(team_is(rail, P / t->want_lsa, r / t->want_lsa, t->want_lsa));
  for (int m = 0; m < lsa.nRanks; m++) {
    int w = r - lsa.rank + m;
    EXPECT(ncclTeamRankToWorld(comm, lsa, m) == w);
    EXPECT(ncclTeamRankToLsa(comm, world, w) == m);
  }
  for (int m = 0; m < rail.nRanks; m++)
    EXPECT(ncclTeamRankToWorld(comm, rail, m) == m * t->want_lsa + r % t->want_lsa);
  /* A rank of another host is on no LSA team of this rank. */
  int far = (r + t->want_lsa) % P;
  if (t->want_lsa < P) {
    EXPECT(ncclTeamRankToLsa(comm, world, far) == -1);
    expect_message(comm, "not on rank");
  }
  EXPECT(ncclTeamRankToWorld(comm, world, P) == -1);
  expect_message(comm, "outside the team");

  ncclCommProperties_t props = NCCL_COMM_PROPERTIES_INITIALIZER;
  CHECK(ncclCommQueryProperties(comm, &props));
  EXPECT(props.size == sizeof props && props.magic == NCCL_API_MAGIC);
  EXPECT(props.rank == r && props.nRanks == P && props.cudaDev == 0);
  EXPECT(props.nLsaTeams == P / t->want_lsa);
  EXPECT(!props.deviceApiSupport && !props.multimemSupport && props.hostRmaSupport);
  EXPECT(props.ginType == NCCL_GIN_TYPE_NONE && !props.cftSupport);
  if (write(t->hashes[1], &props.commHash, sizeof props.commHash) != sizeof props.commHash)
    abort();

  CHECK(ncclCommFinalize(comm));
  CHECK(ncclCommDestroy(comm));
}

static void teams_on(int (*host_of)(int), int want_lsa) {
  enum { P = 4 };
  struct teams t = {host_of, want_lsa, {-1, -1}};
  if (pipe(t.hashes)) abort();
  fork_ranks(P, teams_setup, teams_rank, &t);
  close(t.hashes[1]);
  uint64_t first = 0, hash;
  int got = 0;
  while (read(t.hashes[0], &hash, sizeof hash) == sizeof hash) {
    if (got++ == 0) first = hash;
    EXPECT(hash == first);
  }
  close(t.hashes[0]);
  EXPECT(got == P);
}

static int two_consecutive_per_host(int r) { return r / 2; }
static int alternating_hosts(int r) { return r % 2; }

static void case_teams(void) {
  teams_on(two_consecutive_per_host, 2);
  /* Ranks 0 and 2 share a host: no strided team spans it. */
  teams_on(alternating_hosts, 1);
}

/* One rank: what the communicator does not have, and argument checks. */
static void case_unsupported(void) {
  ncclComm_t comm;
  CHECK(ncclCommInitAll(&comm, 1, NULL));
  ncclTeam_t world = ncclTeamWorld(comm);
  EXPECT(team_is(world, 1, 0, 1));

  ncclTeam_t cft = ncclTeamCft(comm, NCCL_CFT_TEAM_FLAT);
  EXPECT(cft.nRanks == 0);
  expect_message(comm, "no CFT");
  EXPECT(ncclTeamCftMultimem(comm).nRanks == 0);
  expect_message(comm, "ncclTeamCftMultimem");
  EXPECT(ncclTeamWorld(NULL).nRanks == 0);
  expect_message(NULL, "ncclTeamWorld");

  /* An older, shorter struct gets only the fields it has. */
  ncclCommProperties_t props;
  memset(&props, 0x5a, sizeof props);
  props.size = offsetof(ncclCommProperties_t, commHash);
  props.magic = NCCL_API_MAGIC;
  CHECK(ncclCommQueryProperties(comm, &props));
  EXPECT(props.nRanks == 1 && props.nLsaTeams == 1);
  unsigned char cft_byte;
  memcpy(&cft_byte, &props.cftSupport, 1);
  EXPECT(props.ginMinStride == 0x5a5a5a5a && cft_byte == 0x5a);
  props.magic = 0;
  EXPECT(ncclCommQueryProperties(comm, &props) == ncclInvalidArgument);
  expect_message(comm, "NCCL_COMM_PROPERTIES_INITIALIZER");
  EXPECT(ncclCommQueryProperties(comm, NULL) == ncclInvalidArgument);

  /* A window starts on NCCL_WIN_REQUIRED_ALIGNMENT, as ncclMemAlloc's do. */
  void *buf = NULL;
  CHECK(ncclMemAlloc(&buf, 4096));
  ncclWindow_t win;
  CHECK(ncclCommWindowRegister(comm, buf, 4096, &win, NCCL_WIN_DEFAULT));
  void *ptr = NULL;
  ncclMultimemHandle_t mm = {NULL};
  ncclCftLeId le;
  size_t le_offset;
  EXPECT_UNSUPPORTED(ncclGetMultimemDevicePointer(win, 0, mm, &ptr), "multimem");
  EXPECT_UNSUPPORTED(ncclGetLsaDevicePointer(win, 0, 0, &ptr), "LSA");
  EXPECT_UNSUPPORTED(ncclGetMultimemDeviceLeInfo(win, 0, &le, &le_offset), "CFT multicast");
  EXPECT_UNSUPPORTED(ncclGetCftDeviceLeInfo(win, 0, 0, world, &le, &le_offset), "CFT");
  EXPECT_UNSUPPORTED(ncclGetPeerDeviceLeInfo(win, 0, 0, &le, &le_offset), "CFT");
  EXPECT(ptr == NULL);
  CHECK(ncclCommWindowDeregister(comm, win));
  CHECK(ncclMemFree(buf));

  ncclDevResourceRequirements_t req;
  ncclLsaBarrierHandle_t lsa_barrier;
  ncclGinBarrierHandle_t gin_barrier;
  ncclLLA2AHandle_t lla2a;
  char box[32];
  EXPECT_UNSUPPORTED(ncclLsaBarrierCreateRequirement(world, 1, &lsa_barrier, &req), "LSA barriers");
  EXPECT_UNSUPPORTED(ncclGinBarrierCreateRequirement(comm, world, 1, &gin_barrier, &req),
                     "GIN (GPU-initiated networking) barriers");
  EXPECT_UNSUPPORTED(ncclGinOutboxCreateRequirement(1, 12, box, &req), "GIN outboxes");
  EXPECT_UNSUPPORTED(ncclGinInboxA2ACreateRequirement(world, 1, 12, box, &req), "GIN all-to-all");
  EXPECT_UNSUPPORTED(ncclLLA2ACreateRequirement(1, 8, &lla2a, &req), "LL all-to-all");

  /* One 8-byte payload per slot. */
  EXPECT(ncclLLA2ACalcSlots(10, 12) == 20);
  EXPECT(ncclLLA2ACalcSlots(3, 8) == 3);
  EXPECT(ncclLLA2ACalcSlots(0, 16) == 0);
  EXPECT(ncclLLA2ACalcSlots(-1, 8) == -1);
  expect_message(NULL, "non-negative");

  ncclResetDebugInitInternal();
  EXPECT(team_is(ncclTeamWorld(comm), 1, 0, 1));
  CHECK(ncclCommDestroy(comm));
}

int main(int argc, char **argv) {
  if (argc < 2 || strcmp(argv[1], "layout") == 0) {
    layout();
    return 0;
  }
  if (strcmp(argv[1], "teams") == 0) {
    case_teams();
  } else if (strcmp(argv[1], "unsupported") == 0) {
    case_unsupported();
  } else {
    fprintf(stderr, "unknown case %s\n", argv[1]);
    return 2;
  }
  if (failures == 0) printf("%s: ok\n", argv[1]);
  return failures ? 1 : 0;
}
