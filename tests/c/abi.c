/*
 * ABI check: prints the sizes, offsets, enum values and macros of nccl.h,
 * and takes the address of every function (and its pnccl alias) with the
 * exact type the API gives it. Built against ffi/include/nccl.h and against
 * NVIDIA's nccl.h, the two outputs must be identical; linking proves
 * librcclrs exports every symbol.
 */
#include <nccl.h>

#include <stddef.h>
#include <stdio.h>

#define SIZE(t) printf("sizeof(%s) = %zu\n", #t, sizeof(t))
#define OFF(t, f) printf("offsetof(%s, %s) = %zu\n", #t, #f, offsetof(t, f))
#define VAL(v) printf("%s = %lld\n", #v, (long long)(v))

/* Each function with its type, and its profiling alias. */
#define FN(ret, name, args)            \
  do {                                 \
    ret(*volatile f_) args = name;     \
    ret(*volatile p_) args = p##name;  \
    nfns += (f_ != NULL) + (p_ != NULL); \
  } while (0)

int main(void) {
  int nfns = 0;
  SIZE(ncclUniqueId); SIZE(ncclConfig_t); SIZE(ncclCollConfig_t); SIZE(ncclSimInfo_t);
  SIZE(ncclConfigExt_t); SIZE(ncclEncryptionConfig_t); SIZE(ncclWaitSignalDesc_t);
  SIZE(ncclResult_t); SIZE(ncclDataType_t); SIZE(ncclRedOp_t); SIZE(ncclScalarResidence_t);
  SIZE(ncclComm_t); SIZE(ncclWindow_t); SIZE(cudaStream_t);
  OFF(ncclConfig_t, size); OFF(ncclConfig_t, magic); OFF(ncclConfig_t, version);
  OFF(ncclConfig_t, blocking); OFF(ncclConfig_t, cgaClusterSize); OFF(ncclConfig_t, minCTAs);
  OFF(ncclConfig_t, maxCTAs); OFF(ncclConfig_t, netName); OFF(ncclConfig_t, splitShare);
  OFF(ncclConfig_t, trafficClass); OFF(ncclConfig_t, commName); OFF(ncclConfig_t, collnetEnable);
  OFF(ncclConfig_t, CTAPolicy); OFF(ncclConfig_t, shrinkShare); OFF(ncclConfig_t, nvlsCTAs);
  OFF(ncclConfig_t, nChannelsPerNetPeer); OFF(ncclConfig_t, nvlinkCentricSched);
  OFF(ncclConfig_t, graphUsageMode); OFF(ncclConfig_t, numRmaCtx); OFF(ncclConfig_t, maxP2pPeers);
  OFF(ncclConfig_t, graphStreamOrdering); OFF(ncclConfig_t, launchOrderImplicit);
  OFF(ncclConfig_t, numRmaSig); OFF(ncclConfig_t, rmaEagerInit); OFF(ncclConfig_t, hostCftMode);
  OFF(ncclConfig_t, nvlsHostMode);
  OFF(ncclCollConfig_t, ext); OFF(ncclCollConfig_t, minCTAs); OFF(ncclCollConfig_t, maxCTAs);
  OFF(ncclCollConfig_t, nvlsCTAs); OFF(ncclCollConfig_t, cgaClusterSize);
  OFF(ncclCollConfig_t, algSelection); OFF(ncclCollConfig_t, forceAlgSelection);
  OFF(ncclCollConfig_t, CTAPolicy); OFF(ncclCollConfig_t, userProfilerTag);
  OFF(ncclCollConfig_t, launchCompletionEvent);
  OFF(ncclSimInfo_t, estimatedTime); OFF(ncclEncryptionConfig_t, mode); OFF(ncclEncryptionConfig_t, psk);
  OFF(ncclConfigExt_t, key); OFF(ncclConfigExt_t, val);
  OFF(ncclWaitSignalDesc_t, ctx);

  VAL(NCCL_MAJOR); VAL(NCCL_MINOR); VAL(NCCL_PATCH); VAL(NCCL_VERSION_CODE);
  VAL(NCCL_VERSION(2, 8, 4)); VAL(NCCL_VERSION(2, 32, 3)); printf("NCCL_SUFFIX = '%s'\n", NCCL_SUFFIX);
  VAL(NCCL_UNIQUE_ID_BYTES); VAL(NCCL_CONFIG_UNDEF_INT); VAL(NCCL_SPLIT_NOCOLOR); VAL(NCCL_API_MAGIC);
  VAL(NCCL_UNDEF_FLOAT); VAL(NCCL_WIN_DEFAULT); VAL(NCCL_WIN_COLL_SYMMETRIC); VAL(NCCL_WIN_STRICT_ORDERING);
  VAL(NCCL_WIN_GIN_ONLY); VAL(NCCL_WIN_CFT_COUNTED); VAL(NCCL_WIN_REQUIRED_ALIGNMENT);
  VAL(NCCL_CTA_POLICY_DEFAULT); VAL(NCCL_CTA_POLICY_EFFICIENCY); VAL(NCCL_CTA_POLICY_ZERO);
  VAL(NCCL_SHRINK_DEFAULT); VAL(NCCL_SHRINK_ABORT); VAL(NCCL_REVOKE_DEFAULT); VAL(NCCL_SUSPEND_MEM);
  VAL(ncclSuccess); VAL(ncclUnhandledCudaError); VAL(ncclSystemError); VAL(ncclInternalError);
  VAL(ncclInvalidArgument); VAL(ncclInvalidUsage); VAL(ncclRemoteError); VAL(ncclInProgress);
  VAL(ncclTimeout); VAL(ncclNumResults);
  VAL(ncclSum); VAL(ncclProd); VAL(ncclMax); VAL(ncclMin); VAL(ncclAvg); VAL(ncclNumOps); VAL(ncclMaxRedOp);
  VAL(ncclInt8); VAL(ncclChar); VAL(ncclUint8); VAL(ncclInt32); VAL(ncclInt); VAL(ncclUint32);
  VAL(ncclInt64); VAL(ncclUint64); VAL(ncclFloat16); VAL(ncclHalf); VAL(ncclFloat32); VAL(ncclFloat);
  VAL(ncclFloat64); VAL(ncclDouble); VAL(ncclBfloat16); VAL(ncclFloat8e4m3); VAL(ncclFloat8e5m2);
  VAL(ncclNumTypes); VAL(ncclScalarDevice); VAL(ncclScalarHostImmediate);
  VAL(ncclStatGpuMemSuspend); VAL(ncclStatGpuMemSuspended); VAL(ncclStatGpuMemPersist); VAL(ncclStatGpuMemTotal);
  VAL(ncclHostCftDefault); VAL(ncclHostCftEnable); VAL(ncclHostCftDisable); VAL(ncclHostCftFallback);
  VAL(ncclNvlsHostModeDefault); VAL(ncclNvlsHostModeEnable); VAL(ncclNvlsHostModeDisableTransport);
  VAL(ncclNvlsHostModeDisableSymmetricMultimem); VAL(ncclNvlsHostModeDisable);
  VAL(NCCL_ENCRYPTION_MODE_NONE); VAL(NCCL_ENCRYPTION_MODE_PSK);

  {
    ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
    ncclCollConfig_t cc = NCCL_COLLCONFIG_INITIALIZER;
    ncclSimInfo_t s = NCCL_SIM_INFO_INITIALIZER;
    ncclEncryptionConfig_t e = NCCL_ENCRYPTION_CONFIG_INITIALIZER;
    printf("config init: %zu %x %u %d %d %d\n", c.size, c.magic, c.version, c.blocking, c.minCTAs, c.nvlsHostMode);
    printf("collconfig init: %zu %x %u %d %d\n", cc.size, cc.magic, cc.version, cc.forceAlgSelection, cc.CTAPolicy);
    printf("siminfo init: %zu %x %u %g\n", s.size, s.magic, s.version, s.estimatedTime);
    printf("encryption init: %zu %x %u %d\n", e.size, e.magic, e.version, e.mode);
  }

  FN(ncclResult_t, ncclMemAlloc, (void **, size_t));
  FN(ncclResult_t, ncclMemFree, (void *));
  FN(ncclResult_t, ncclGetVersion, (int *));
  FN(ncclResult_t, ncclGetUniqueId, (ncclUniqueId *));
  FN(ncclResult_t, ncclCommInitRankConfig, (ncclComm_t *, int, ncclUniqueId, int, ncclConfig_t *));
  FN(ncclResult_t, ncclCommInitRank, (ncclComm_t *, int, ncclUniqueId, int));
  FN(ncclResult_t, ncclCommInitAll, (ncclComm_t *, int, const int *));
  FN(ncclResult_t, ncclCommFinalize, (ncclComm_t));
  FN(ncclResult_t, ncclCommDestroy, (ncclComm_t));
  FN(ncclResult_t, ncclCommAbort, (ncclComm_t));
  FN(ncclResult_t, ncclCommRevoke, (ncclComm_t, int));
  FN(ncclResult_t, ncclCommSplit, (ncclComm_t, int, int, ncclComm_t *, ncclConfig_t *));
  FN(ncclResult_t, ncclCommShrink, (ncclComm_t, int *, int, ncclComm_t *, ncclConfig_t *, int));
  FN(ncclResult_t, ncclCommGetUniqueId, (ncclComm_t, ncclUniqueId *));
  FN(ncclResult_t, ncclCommGrow, (ncclComm_t, int, const ncclUniqueId *, int, ncclComm_t *, ncclConfig_t *));
  FN(ncclResult_t, ncclCommInitRankScalable, (ncclComm_t *, int, int, int, ncclUniqueId *, ncclConfig_t *));
  FN(const char *, ncclGetErrorString, (ncclResult_t));
  FN(const char *, ncclGetLastError, (ncclComm_t));
  FN(ncclResult_t, ncclCommGetAsyncError, (ncclComm_t, ncclResult_t *));
  FN(ncclResult_t, ncclCommCount, (const ncclComm_t, int *));
  FN(ncclResult_t, ncclCommCuDevice, (const ncclComm_t, int *));
  FN(ncclResult_t, ncclCommUserRank, (const ncclComm_t, int *));
  FN(ncclResult_t, ncclCommRegister, (const ncclComm_t, void *, size_t, void **));
  FN(ncclResult_t, ncclCommDeregister, (const ncclComm_t, void *));
  FN(ncclResult_t, ncclCommSuspend, (ncclComm_t, int));
  FN(ncclResult_t, ncclCommResume, (ncclComm_t));
  FN(ncclResult_t, ncclCommMemStats, (ncclComm_t, ncclCommMemStat_t, uint64_t *));
  FN(ncclResult_t, ncclCommWindowRegister, (ncclComm_t, void *, size_t, ncclWindow_t *, int));
  FN(ncclResult_t, ncclCommWindowDeregister, (ncclComm_t, ncclWindow_t));
  FN(ncclResult_t, ncclWinGetUserPtr, (ncclComm_t, ncclWindow_t, void **));
  FN(ncclResult_t, ncclRedOpCreatePreMulSum, (ncclRedOp_t *, void *, ncclDataType_t, ncclScalarResidence_t, ncclComm_t));
  FN(ncclResult_t, ncclRedOpDestroy, (ncclRedOp_t, ncclComm_t));
  FN(ncclResult_t, ncclReduce, (const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t, cudaStream_t));
  FN(ncclResult_t, ncclBcast, (void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t));
  FN(ncclResult_t, ncclBroadcast, (const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t));
  FN(ncclResult_t, ncclAllReduce, (const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t));
  FN(ncclResult_t, ncclReduceScatter, (const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t));
  FN(ncclResult_t, ncclAllGather, (const void *, void *, size_t, ncclDataType_t, ncclComm_t, cudaStream_t));
  FN(ncclResult_t, ncclAlltoAll, (const void *, void *, size_t, ncclDataType_t, ncclComm_t, cudaStream_t));
  FN(ncclResult_t, ncclGather, (const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t));
  FN(ncclResult_t, ncclScatter, (const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t));
  FN(ncclResult_t, ncclAllReduceConfig, (const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t, const ncclCollConfig_t *));
  FN(ncclResult_t, ncclBroadcastConfig, (const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t, const ncclCollConfig_t *));
  FN(ncclResult_t, ncclReduceConfig, (const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t, cudaStream_t, const ncclCollConfig_t *));
  FN(ncclResult_t, ncclAllGatherConfig, (const void *, void *, size_t, ncclDataType_t, ncclComm_t, cudaStream_t, const ncclCollConfig_t *));
  FN(ncclResult_t, ncclReduceScatterConfig, (const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t, const ncclCollConfig_t *));
  FN(ncclResult_t, ncclAlltoAllConfig, (const void *, void *, size_t, ncclDataType_t, ncclComm_t, cudaStream_t, const ncclCollConfig_t *));
  FN(ncclResult_t, ncclGatherConfig, (const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t, const ncclCollConfig_t *));
  FN(ncclResult_t, ncclScatterConfig, (const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t, const ncclCollConfig_t *));
  FN(ncclResult_t, ncclSend, (const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t));
  FN(ncclResult_t, ncclRecv, (void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t));
  FN(ncclResult_t, ncclPutSignal, (const void *, size_t, ncclDataType_t, int, ncclWindow_t, size_t, int, int, unsigned int, ncclComm_t, cudaStream_t));
  FN(ncclResult_t, ncclSignal, (int, int, int, unsigned int, ncclComm_t, cudaStream_t));
  FN(ncclResult_t, ncclWaitSignal, (int, ncclWaitSignalDesc_t *, ncclComm_t, cudaStream_t));
  FN(ncclResult_t, ncclGroupStart, (void));
  FN(ncclResult_t, ncclGroupEnd, (void));
  FN(ncclResult_t, ncclGroupSimulateEnd, (ncclSimInfo_t *));
  FN(ncclResult_t, ncclSetEncryption, (const ncclEncryptionConfig_t *));
  FN(ncclResult_t, ncclParamBind, (ncclParamHandle_t *, const char *));
  FN(ncclResult_t, ncclParamGetI8, (ncclParamHandle_t, int8_t *));
  FN(ncclResult_t, ncclParamGetI16, (ncclParamHandle_t, int16_t *));
  FN(ncclResult_t, ncclParamGetI32, (ncclParamHandle_t, int32_t *));
  FN(ncclResult_t, ncclParamGetI64, (ncclParamHandle_t, int64_t *));
  FN(ncclResult_t, ncclParamGetU8, (ncclParamHandle_t, uint8_t *));
  FN(ncclResult_t, ncclParamGetU16, (ncclParamHandle_t, uint16_t *));
  FN(ncclResult_t, ncclParamGetU32, (ncclParamHandle_t, uint32_t *));
  FN(ncclResult_t, ncclParamGetU64, (ncclParamHandle_t, uint64_t *));
  FN(ncclResult_t, ncclParamGetStr, (ncclParamHandle_t, const char **));
  FN(ncclResult_t, ncclParamGet, (ncclParamHandle_t, void *, int, int *));
  FN(ncclResult_t, ncclParamGetParameter, (const char *, const char **, int *));
  FN(ncclResult_t, ncclParamGetAllParameterKeys, (const char ***, int *));
  FN(void, ncclParamDumpAll, (void));
  printf("functions: %d\n", nfns);
  return 0;
}
