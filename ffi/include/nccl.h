/*
 * nccl.h for rccl-rs (librcclrs): the NCCL C API, ABI-compatible with
 * NCCL 2.32 (NCCL_VERSION_CODE 23206).
 *
 * Written for rccl-rs from the API's published facts: function names and
 * signatures, enum values, and struct layouts. Buffers may be host memory
 * or CUDA device memory (a call on device memory is enqueued on its
 * stream); see docs/C-API.md for what each function does here.
 *
 * This header does not need the CUDA headers. When they are included
 * first, their cudaStream_t / cudaEvent_t are used (the definitions agree).
 *
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef NCCL_H_
#define NCCL_H_

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

/* ---- API level ------------------------------------------------------- */

#define NCCL_MAJOR 2
#define NCCL_MINOR 32
#define NCCL_PATCH 6
#define NCCL_SUFFIX ""

/* Versions up to 2.8 were encoded X*1000+Y*100+Z, later ones X*10000+Y*100+Z. */
#define NCCL_VERSION(X, Y, Z) \
  (((X) <= 2 && (Y) <= 8) ? (X) * 1000 + (Y) * 100 + (Z) : (X) * 10000 + (Y) * 100 + (Z))
#define NCCL_VERSION_CODE 23206

/* Marks the rccl-rs implementation of this header. */
#define RCCLRS_NCCL_H 1

/* ---- CUDA handle types, without the CUDA headers ---------------------- */

#if !defined(__DRIVER_TYPES_H__)
struct CUstream_st;
struct CUevent_st;
typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Opaque handles and the unique id --------------------------------- */

typedef struct ncclComm *ncclComm_t;
typedef struct ncclWindow_vidmem *ncclWindow_t;
#define NCCL_COMM_NULL NULL

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

/* ---- Result codes ----------------------------------------------------- */

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclTimeout = 8,
  ncclNumResults = 9
} ncclResult_t;

/* ---- Configuration constants ------------------------------------------ */

#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR NULL
#define NCCL_SPLIT_NOCOLOR -1
#define NCCL_UNDEF_FLOAT -1.0f
#define NCCL_API_MAGIC 0xcafebeef

/* ncclCommWindowRegister flags */
#define NCCL_WIN_DEFAULT 0x00
#define NCCL_WIN_COLL_SYMMETRIC 0x01
#define NCCL_WIN_STRICT_ORDERING 0x02
#define NCCL_WIN_GIN_ONLY 0x04
#define NCCL_WIN_CFT_COUNTED 0x08
#define NCCL_WIN_REQUIRED_ALIGNMENT 4096

/* ncclConfig_t.CTAPolicy bits */
#define NCCL_CTA_POLICY_DEFAULT 0x00
#define NCCL_CTA_POLICY_EFFICIENCY 0x01
#define NCCL_CTA_POLICY_ZERO 0x02

/* ncclCommShrink flags */
#define NCCL_SHRINK_DEFAULT 0x00
#define NCCL_SHRINK_ABORT 0x01

/* ncclCommRevoke flags (must be 0) */
#define NCCL_REVOKE_DEFAULT 0x00

/* ncclCommSuspend flags */
#define NCCL_SUSPEND_MEM 0x01

typedef enum {
  ncclHostCftDefault = NCCL_CONFIG_UNDEF_INT,
  ncclHostCftEnable = 1,
  ncclHostCftDisable = 2,
  ncclHostCftFallback = 3
} ncclHostCftMode_t;

typedef enum {
  ncclNvlsHostModeDefault = NCCL_CONFIG_UNDEF_INT,
  ncclNvlsHostModeEnable = 0,
  ncclNvlsHostModeDisableTransport = 1 << 0,
  ncclNvlsHostModeDisableSymmetricMultimem = 1 << 1,
  ncclNvlsHostModeDisable = INT_MAX
} ncclNvlsHostMode_t;

/* ---- Communicator configuration --------------------------------------- */

/* The leading size/magic/version let the library read configurations
 * written against older headers: fields past `size` keep their defaults. */
typedef struct ncclConfig_v23100 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;           /* 0: non-blocking init and calls; 1 (default): blocking */
  int cgaClusterSize;
  int minCTAs;            /* rccl-rs: fewest channels */
  int maxCTAs;            /* rccl-rs: most channels */
  const char *netName;
  int splitShare;
  int trafficClass;
  const char *commName;   /* rccl-rs: used in error messages */
  int collnetEnable;
  int CTAPolicy;
  int shrinkShare;
  int nvlsCTAs;
  int nChannelsPerNetPeer;
  int nvlinkCentricSched;
  int graphUsageMode;
  int numRmaCtx;
  int maxP2pPeers;
  int graphStreamOrdering;
  int launchOrderImplicit;
  int numRmaSig;
  int rmaEagerInit;
  int hostCftMode;
  int nvlsHostMode;
} ncclConfig_t;

#define NCCL_CONFIG_INITIALIZER {                                              \
  sizeof(ncclConfig_t), NCCL_API_MAGIC, NCCL_VERSION_CODE,                    \
  NCCL_CONFIG_UNDEF_INT /* blocking */, NCCL_CONFIG_UNDEF_INT /* cgaClusterSize */, \
  NCCL_CONFIG_UNDEF_INT /* minCTAs */, NCCL_CONFIG_UNDEF_INT /* maxCTAs */,   \
  NCCL_CONFIG_UNDEF_PTR /* netName */, NCCL_CONFIG_UNDEF_INT /* splitShare */,\
  NCCL_CONFIG_UNDEF_INT /* trafficClass */, NCCL_CONFIG_UNDEF_PTR /* commName */, \
  NCCL_CONFIG_UNDEF_INT /* collnetEnable */, NCCL_CONFIG_UNDEF_INT /* CTAPolicy */, \
  NCCL_CONFIG_UNDEF_INT /* shrinkShare */, NCCL_CONFIG_UNDEF_INT /* nvlsCTAs */, \
  NCCL_CONFIG_UNDEF_INT /* nChannelsPerNetPeer */,                            \
  NCCL_CONFIG_UNDEF_INT /* nvlinkCentricSched */,                             \
  NCCL_CONFIG_UNDEF_INT /* graphUsageMode */, NCCL_CONFIG_UNDEF_INT /* numRmaCtx */, \
  NCCL_CONFIG_UNDEF_INT /* maxP2pPeers */,                                    \
  NCCL_CONFIG_UNDEF_INT /* graphStreamOrdering */,                            \
  NCCL_CONFIG_UNDEF_INT /* launchOrderImplicit */,                            \
  NCCL_CONFIG_UNDEF_INT /* numRmaSig */, NCCL_CONFIG_UNDEF_INT /* rmaEagerInit */, \
  NCCL_CONFIG_UNDEF_INT /* hostCftMode */, NCCL_CONFIG_UNDEF_INT /* nvlsHostMode */ \
}

/* A vendor extension option, chained through ncclCollConfig_t.ext. */
typedef struct ncclConfigExt {
  struct ncclConfigExt *next;
  struct {
    int vendorId;
    int optionId;
  } key;
  union {
    int i;
    const char *s;
    void *raw;
  } val;
} ncclConfigExt_t;

/* Per-call settings of the ncclXxxConfig collectives. */
typedef struct ncclCollConfig_v23200 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  ncclConfigExt_t *ext;
  int minCTAs;
  int maxCTAs;
  int nvlsCTAs;
  int cgaClusterSize;
  const char *algSelection;
  int forceAlgSelection;
  int CTAPolicy;
  uint64_t userProfilerTag;
  cudaEvent_t launchCompletionEvent;
} ncclCollConfig_t;

#define NCCL_COLLCONFIG_INITIALIZER {                                          \
  sizeof(ncclCollConfig_t), NCCL_API_MAGIC, NCCL_VERSION_CODE,                \
  NCCL_CONFIG_UNDEF_PTR /* ext */, NCCL_CONFIG_UNDEF_INT /* minCTAs */,        \
  NCCL_CONFIG_UNDEF_INT /* maxCTAs */, NCCL_CONFIG_UNDEF_INT /* nvlsCTAs */,   \
  NCCL_CONFIG_UNDEF_INT /* cgaClusterSize */, NCCL_CONFIG_UNDEF_PTR /* algSelection */, \
  1 /* forceAlgSelection */, NCCL_CONFIG_UNDEF_INT /* CTAPolicy */,            \
  0 /* userProfilerTag */, NCCL_CONFIG_UNDEF_PTR /* launchCompletionEvent */   \
}

/* What ncclGroupSimulateEnd reports. */
typedef struct ncclSimInfo_v22200 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  float estimatedTime;
} ncclSimInfo_t;

#define NCCL_SIM_INFO_INITIALIZER \
  { sizeof(ncclSimInfo_t), 0x74685283, NCCL_VERSION_CODE, NCCL_UNDEF_FLOAT }

/* ---- Reduction operators, datatypes, scalar residence ------------------ */

typedef enum { ncclNumOps_dummy = 5 } ncclRedOp_dummy_t;
typedef enum {
  ncclSum = 0,
  ncclProd = 1,
  ncclMax = 2,
  ncclMin = 3,
  ncclAvg = 4,
  /* Built-in operators are below ncclNumOps; ncclRedOpCreatePreMulSum
   * returns values from ncclNumOps up. */
  ncclNumOps = 5,
  /* Forces the enum to the width of an int. */
  ncclMaxRedOp = 0x7fffffff >> (32 - 8 * sizeof(ncclRedOp_dummy_t))
} ncclRedOp_t;

typedef enum {
  ncclInt8 = 0, ncclChar = 0,
  ncclUint8 = 1,
  ncclInt32 = 2, ncclInt = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6, ncclHalf = 6,
  ncclFloat32 = 7, ncclFloat = 7,
  ncclFloat64 = 8, ncclDouble = 8,
  ncclBfloat16 = 9,
  ncclFloat8e4m3 = 10,
  ncclFloat8e5m2 = 11,
  ncclNumTypes = 12
} ncclDataType_t;

typedef enum {
  ncclScalarDevice = 0,        /* a host or device pointer, read at each call */
  ncclScalarHostImmediate = 1  /* read once, at creation */
} ncclScalarResidence_t;

typedef enum {
  ncclStatGpuMemSuspend = 0,
  ncclStatGpuMemSuspended = 1,
  ncclStatGpuMemPersist = 2,
  ncclStatGpuMemTotal = 3
} ncclCommMemStat_t;

/* ncclSetEncryption */
typedef enum {
  NCCL_ENCRYPTION_MODE_NONE = 0,
  NCCL_ENCRYPTION_MODE_PSK = 1
} ncclEncryptionMode_t;

typedef struct ncclEncryptionConfig_v23200 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int mode;
  const char *psk;
} ncclEncryptionConfig_t;

#define NCCL_ENCRYPTION_CONFIG_INITIALIZER \
  { sizeof(ncclEncryptionConfig_t), NCCL_API_MAGIC, NCCL_VERSION_CODE, \
    NCCL_ENCRYPTION_MODE_NONE, NCCL_CONFIG_UNDEF_PTR }

/* ncclWaitSignal descriptor */
typedef struct {
  int opCnt;
  int peer;
  int sigIdx;
  int ctx;
} ncclWaitSignalDesc_t;

typedef struct ncclParamHandle *ncclParamHandle_t;

/* ---- Functions ----------------------------------------------------------
 * Each function is also exported with a `p` prefix (pncclAllReduce, ...),
 * the names profiling tools interpose on. */

#define NCCL_RCCLRS_DECLARE(ret, name, args) ret name args; ret p##name args;

/* Memory */
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclMemAlloc, (void **ptr, size_t size))
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclMemFree, (void *ptr))

/* Version, unique id, communicator life cycle */
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclGetVersion, (int *version))
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclGetUniqueId, (ncclUniqueId *uniqueId))
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclCommInitRankConfig,
                    (ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                     ncclConfig_t *config))
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclCommInitRank,
                    (ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank))
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclCommInitAll,
                    (ncclComm_t *comm, int ndev, const int *devlist))
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclCommFinalize, (ncclComm_t comm))
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclCommDestroy, (ncclComm_t comm))
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclCommAbort, (ncclComm_t comm))
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclCommRevoke, (ncclComm_t comm, int revokeFlags))
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclCommSplit,
                    (ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                     ncclConfig_t *config))
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclCommShrink,
                    (ncclComm_t comm, int *excludeRanksList, int excludeRanksCount,
                     ncclComm_t *newcomm, ncclConfig_t *config, int shrinkFlags))
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclCommGetUniqueId, (ncclComm_t comm, ncclUniqueId *uniqueId))
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclCommGrow,
                    (ncclComm_t comm, int nRanks, const ncclUniqueId *uniqueId, int rank,
                     ncclComm_t *newcomm, ncclConfig_t *config))
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclCommInitRankScalable,
                    (ncclComm_t *newcomm, int nranks, int myrank, int nId,
                     ncclUniqueId *commIds, ncclConfig_t *config))

/* Errors */
NCCL_RCCLRS_DECLARE(const char *, ncclGetErrorString, (ncclResult_t result))
NCCL_RCCLRS_DECLARE(const char *, ncclGetLastError, (ncclComm_t comm))
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclCommGetAsyncError, (ncclComm_t comm, ncclResult_t *asyncError))
/* Deprecated upstream; a no-op here. */
NCCL_RCCLRS_DECLARE(void, ncclResetDebugInit, (void))

/* Communicator queries */
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclCommCount, (const ncclComm_t comm, int *count))
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclCommCuDevice, (const ncclComm_t comm, int *device))
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclCommUserRank, (const ncclComm_t comm, int *rank))

/* Buffer registration, suspend / resume, memory statistics, windows */
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclCommRegister,
                    (const ncclComm_t comm, void *buff, size_t size, void **handle))
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclCommDeregister, (const ncclComm_t comm, void *handle))
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclCommSuspend, (ncclComm_t comm, int flags))
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclCommResume, (ncclComm_t comm))
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclCommMemStats,
                    (ncclComm_t comm, ncclCommMemStat_t stat, uint64_t *value))
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclCommWindowRegister,
                    (ncclComm_t comm, void *buff, size_t size, ncclWindow_t *win, int winFlags))
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclCommWindowDeregister, (ncclComm_t comm, ncclWindow_t win))
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclWinGetUserPtr,
                    (ncclComm_t comm, ncclWindow_t win, void **outUserPtr))

/* Reduction operators */
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclRedOpCreatePreMulSum,
                    (ncclRedOp_t *op, void *scalar, ncclDataType_t datatype,
                     ncclScalarResidence_t residence, ncclComm_t comm))
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclRedOpDestroy, (ncclRedOp_t op, ncclComm_t comm))

/* Collectives. In-place: sendbuff == recvbuff (for all-gather, sendbuff ==
 * recvbuff + rank * sendcount; for reduce-scatter, recvbuff == sendbuff +
 * rank * recvcount). */
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclReduce,
                    (const void *sendbuff, void *recvbuff, size_t count,
                     ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                     cudaStream_t stream))
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclBcast,
                    (void *buff, size_t count, ncclDataType_t datatype, int root,
                     ncclComm_t comm, cudaStream_t stream))
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclBroadcast,
                    (const void *sendbuff, void *recvbuff, size_t count,
                     ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream))
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclAllReduce,
                    (const void *sendbuff, void *recvbuff, size_t count,
                     ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                     cudaStream_t stream))
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclReduceScatter,
                    (const void *sendbuff, void *recvbuff, size_t recvcount,
                     ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                     cudaStream_t stream))
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclAllGather,
                    (const void *sendbuff, void *recvbuff, size_t sendcount,
                     ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream))
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclAlltoAll,
                    (const void *sendbuff, void *recvbuff, size_t count,
                     ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream))
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclGather,
                    (const void *sendbuff, void *recvbuff, size_t count,
                     ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream))
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclScatter,
                    (const void *sendbuff, void *recvbuff, size_t count,
                     ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream))

/* Collectives with per-call settings (config may be NULL). */
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclAllReduceConfig,
                    (const void *sendbuff, void *recvbuff, size_t count,
                     ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                     cudaStream_t stream, const ncclCollConfig_t *config))
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclBroadcastConfig,
                    (const void *sendbuff, void *recvbuff, size_t count,
                     ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream,
                     const ncclCollConfig_t *config))
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclReduceConfig,
                    (const void *sendbuff, void *recvbuff, size_t count,
                     ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                     cudaStream_t stream, const ncclCollConfig_t *config))
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclAllGatherConfig,
                    (const void *sendbuff, void *recvbuff, size_t sendcount,
                     ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream,
                     const ncclCollConfig_t *config))
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclReduceScatterConfig,
                    (const void *sendbuff, void *recvbuff, size_t recvcount,
                     ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                     cudaStream_t stream, const ncclCollConfig_t *config))
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclAlltoAllConfig,
                    (const void *sendbuff, void *recvbuff, size_t count,
                     ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream,
                     const ncclCollConfig_t *config))
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclGatherConfig,
                    (const void *sendbuff, void *recvbuff, size_t count,
                     ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream,
                     const ncclCollConfig_t *config))
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclScatterConfig,
                    (const void *sendbuff, void *recvbuff, size_t count,
                     ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream,
                     const ncclCollConfig_t *config))

/* Point to point */
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclSend,
                    (const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                     ncclComm_t comm, cudaStream_t stream))
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclRecv,
                    (void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                     ncclComm_t comm, cudaStream_t stream))

/* One-sided operations on windows */
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclPutSignal,
                    (const void *localbuff, size_t count, ncclDataType_t datatype, int peer,
                     ncclWindow_t peerWin, size_t peerWinOffset, int sigIdx, int ctx,
                     unsigned int flags, ncclComm_t comm, cudaStream_t stream))
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclSignal,
                    (int peer, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm,
                     cudaStream_t stream))
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclWaitSignal,
                    (int nDesc, ncclWaitSignalDesc_t *signalDescs, ncclComm_t comm,
                     cudaStream_t stream))

/* Groups */
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclGroupStart, (void))
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclGroupEnd, (void))
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclGroupSimulateEnd, (ncclSimInfo_t *simInfo))

/* Encryption of the library's connections */
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclSetEncryption, (const ncclEncryptionConfig_t *config))

/* Parameters (the library's settings, by key) */
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclParamBind, (ncclParamHandle_t *out, const char *key))
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclParamGetI8, (ncclParamHandle_t h, int8_t *out))
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclParamGetI16, (ncclParamHandle_t h, int16_t *out))
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclParamGetI32, (ncclParamHandle_t h, int32_t *out))
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclParamGetI64, (ncclParamHandle_t h, int64_t *out))
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclParamGetU8, (ncclParamHandle_t h, uint8_t *out))
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclParamGetU16, (ncclParamHandle_t h, uint16_t *out))
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclParamGetU32, (ncclParamHandle_t h, uint32_t *out))
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclParamGetU64, (ncclParamHandle_t h, uint64_t *out))
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclParamGetStr, (ncclParamHandle_t h, const char **out))
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclParamGet,
                    (ncclParamHandle_t h, void *out, int maxLen, int *len))
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclParamGetParameter,
                    (const char *key, const char **value, int *valueLen))
NCCL_RCCLRS_DECLARE(ncclResult_t, ncclParamGetAllParameterKeys, (const char ***table, int *tableLen))
NCCL_RCCLRS_DECLARE(void, ncclParamDumpAll, (void))

#undef NCCL_RCCLRS_DECLARE

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* NCCL_H_ */
